"""Knowledge base, round two (issue 14): stacks built from primary facts, checked by the one validator.

Each row names the fact it is built from: NVIDIA's CUDA GPUs page (https://developer.nvidia.com/cuda-gpus) and
MIG guide, the CUDA 12.9 features archive (sm_103), NVIDIA's release-notes component tables, PyTorch's wheel
index file names (cu129 and cpu builds), and wheel METADATA read from PyPI (vLLM's companion pins and their
Requires-Python). A good stack must validate with no error and exactly the warning links listed; a bad one
must fail on the named link with a message naming both ends.
"""

from __future__ import annotations

import csv
import re

import pytest
from packaging.version import Version

from gpufleet import PROJECT_ROOT, compat, compat_refresh

from ansible_collections.gpufleet.fleet.plugins.module_utils import stack_spec, stack_versions
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_declared

KB = compat.load_knowledge_base()
KB_DIR = PROJECT_ROOT / "data" / "compat"


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


def cpu(torch):
    return {
        "gpu": [],
        "driver": None,
        "cuda": None,
        "python": "3.12",
        "torch": torch,
        "torch_variant": "cpu",
        "vllm": None,
    }


def h100_cu129(**overrides):
    """vLLM 0.12.0-0.19.1 wheels are built with CUDA 12.9 (vllm.csv); driver 575.57.08 is CUDA 12.9 Update 1's."""
    base = {
        "gpu": ["NVIDIA H100 80GB HBM3"],
        "driver": "575.57.08",
        "cuda": "12.9",
        "python": "3.12",
        "torch_variant": "cu129",
    }
    base.update(overrides)
    return stack(**base)


# The stack of the posts the project started from: the runfile cuda_12.1.105_530.30.02_linux.run names the
# cudart version, not the toolkit release (CUDA 12.1 Update 1 is cuda_12.1.1_530.30.02_linux.run).
SEED = stack(
    gpu=["NVIDIA H100 80GB HBM3"],
    driver="530.30.02",
    cuda="12.1.105",
    python="3.11",
    torch="2.3.1",
    torch_variant="cu121",
    vllm="0.5.3",
)

# (id, stack, expected warning links)
GOOD = [
    # cu129 builds on the wheel index (download.pytorch.org/whl/cu129/torch/): a torch of vLLM's own CUDA.
    # vLLM 0.12.0-0.19.1 publish manylinux_2_31 wheels only (PyPI's file lists, wheel_platforms.csv): a stack
    # without a platform is warned that the wheelhouse's default manylinux_2_28_x86_64 finds none (issue 36).
    ("vllm-0.19.1-torch-2.10.0+cu129", h100_cu129(torch="2.10.0", vllm="0.19.1"), ["torch -> gpu", "platform -> vllm"]),
    ("vllm-0.17.0-torch-2.10.0+cu129", h100_cu129(torch="2.10.0", vllm="0.17.0"), ["torch -> gpu", "platform -> vllm"]),
    ("vllm-0.14.0-torch-2.9.1+cu129", h100_cu129(torch="2.9.1", vllm="0.14.0"), ["torch -> gpu", "platform -> vllm"]),
    ("vllm-0.12.0-torch-2.9.0+cu129", h100_cu129(torch="2.9.0", vllm="0.12.0"), ["torch -> gpu", "platform -> vllm"]),
    (
        "torch-2.9.0+cu129-driver-12.8",
        stack(gpu=["H200"], driver="570.124.06", cuda=None, torch="2.9.0", torch_variant="cu129"),
        ["driver -> torch", "torch -> gpu"],
    ),
    (
        "torch-2.10.0+cu129-driver-12.2",
        stack(gpu=["H200"], driver="535.104.05", cuda=None, torch="2.10.0", torch_variant="cu129"),
        ["driver -> torch", "torch -> gpu"],
    ),
    (
        "torch-2.8.0+cu129-matrix-experimental",
        stack(cuda=None, torch="2.8.0", torch_variant="cu129"),
        ["torch -> gpu", "torch -> torch_variant"],
    ),
    # cpu builds on download.pytorch.org/whl/cpu/torch/: no third-party warning any more.
    ("torch-2.7.0+cpu", cpu("2.7.0"), []),
    ("torch-2.7.1+cpu", cpu("2.7.1"), []),
    ("torch-2.8.0+cpu", cpu("2.8.0"), []),
    ("torch-2.14.0+cpu", cpu("2.14.0"), []),
    ("torch-2.14.1+cpu-tagged", cpu("2.14.1+cpu"), []),
    ("torch-2.5.1+cpu-official", cpu("2.5.1"), []),
    ("torch-2.10.0+cpu-official", cpu("2.10.0"), []),
    ("torch-2.11.0+cpu-official", cpu("2.11.0"), []),
    ("torch-2.12.0+cpu-official", cpu("2.12.0"), []),
    ("torch-2.12.1+cpu-still-third-party", cpu("2.12.1"), ["torch -> torch_variant"]),
    # GPUs of NVIDIA's CUDA GPUs page, as nvidia-smi names them; torch 2.11.0+cu130's arch list (a real
    # capture) has sm_90/sm_100/sm_120 cubins and sm_86 runs sm_80's.
    ("gh200", stack(gpu=["NVIDIA GH200 480GB"]), []),
    ("l40", stack(gpu=["NVIDIA L40"]), []),
    ("rtx-6000-ada", stack(gpu=["NVIDIA RTX 6000 Ada Generation"]), []),
    ("a40", stack(gpu=["NVIDIA A40"]), []),
    ("gb200", stack(gpu=["NVIDIA GB200"]), []),
    ("b300-cc-10.3-runs-sm_100", stack(gpu=["NVIDIA B300"]), []),
    ("gb300-cc-10.3", stack(gpu=["NVIDIA GB300"]), []),
    ("rtx-pro-6000-server", stack(gpu=["NVIDIA RTX PRO 6000 Blackwell Server Edition"]), []),
    ("rtx-pro-6000-workstation", stack(gpu=["NVIDIA RTX PRO 6000 Blackwell Workstation Edition"]), []),
    ("h20-mig-guide", stack(gpu=["NVIDIA H20"]), []),
    (
        "b300-cu128-binaries-run-sm_100-code",
        stack(gpu=["NVIDIA B300"], driver="580.95.05", cuda=None, torch="2.8.0", torch_variant="cu128", vllm="0.11.0"),
        ["gpu -> cuda"],
    ),
    # Newer drivers run older CUDA: the 12.x minor-version upper end (580) is no limit.
    (
        "toolkit-12.3.2-driver-580",
        stack(gpu=["H100"], driver="580.95.05", cuda="12.3.2", torch="2.9.0", torch_variant="cu129"),
        ["cuda -> torch", "driver -> cuda", "torch -> gpu"],
    ),
    (
        "toolkit-12.3.2-driver-535-minor-compat",
        stack(gpu=["H100"], driver="535.104.05", cuda="12.3.2", torch="2.4.0", torch_variant="cu121"),
        ["cuda -> torch", "driver -> cuda"],
    ),
    (
        "toolkit-12.2.2-driver-580.159",
        stack(gpu=["H100"], driver="580.159.04", cuda="12.2.2", torch="2.4.0", torch_variant="cu121"),
        ["cuda -> torch"],
    ),
    (
        "toolkit-11.8-driver-580",
        stack(gpu=["A100"], driver="580.95.05", cuda="11.8", torch="2.6.0", torch_variant="cu118"),
        ["torch -> gpu"],
    ),
    # CUDA 13.3.x: its driver floor is known from third-party copies only, and says so.
    (
        "toolkit-13.3.0-third-party-floor",
        stack(driver="610.43.02", cuda="13.3.0", torch="2.14.0", torch_variant="cu132"),
        ["cuda -> torch", "driver -> cuda", "torch -> gpu"],
    ),
    (
        "toolkit-13.3.1-minor-compat",
        stack(driver="595.71.05", cuda="13.3.1", torch="2.14.0", torch_variant="cu132"),
        ["cuda -> torch", "driver -> cuda", "torch -> gpu"],
    ),
    # Python patch releases against the companions' Requires-Python (torchvision: '>=3.10,!=3.14.1').
    ("python-3.14.2-vllm-0.33.0", stack(python="3.14.2", torch="2.14.0", vllm="0.33.0"), []),
    # vLLM 0.20.0's wheels are manylinux_2_35 (PyPI's file list): declared on Ubuntu 24.04's glibc 2.39, no warning.
    ("python-3.14.0-vllm-0.20.0", stack(python="3.14.0", vllm="0.20.0", platform="manylinux_2_39_x86_64"), []),
    ("python-3.14-vllm-0.26.0", stack(python="3.14", vllm="0.26.0"), []),
    # Component versions: the fix the validator names is accepted.
    ("seed-with-toolkit-release", dict(SEED, cuda="12.1.1"), ["torch -> torch_variant", "vllm -> torch_variant"]),
    # Arch lists read from the PyPI default wheels' libtorch_python.so (torch_arch_lists.csv).
    (
        "rtx-5090-torch-2.8.0+cu128-has-sm_120",
        stack(gpu=["NVIDIA GeForce RTX 5090"], driver="570.124.06", cuda=None, torch="2.8.0", torch_variant="cu128"),
        [],
    ),
    (
        "l4-sm_89-runs-the-sm_86-cubin-of-2.4.0+cu121",
        stack(gpu=["NVIDIA L4"], driver="535.104.05", cuda=None, torch="2.4.0", torch_variant="cu121"),
        [],
    ),
    ("h100-torch-2.13.0+cu130-has-sm_90", stack(gpu=["NVIDIA H100 80GB HBM3"], torch="2.13.0", vllm="0.27.0"), []),
    (
        "t4-torch-2.15.0+cu132-has-sm_75",
        stack(gpu=["Tesla T4"], driver="595.71.05", cuda=None, python="3.13", torch="2.15.0", torch_variant="cu132"),
        ["gpu"],
    ),
]

# (id, stack, link, substrings one error of that link must contain)
BAD = [
    (
        "python-3.14.1-torchvision-0.26.0",
        stack(python="3.14.1", vllm="0.26.0"),
        "python -> torchvision",
        ["torchvision 0.26.0 (pinned by vllm 0.26.0)", ">=3.10,!=3.14.1", "python 3.14.1"],
    ),
    (
        "python-3.14.1-torchvision-0.28.0",
        stack(python="3.14.1", torch="2.13.0", vllm="0.32.0"),
        "python -> torchvision",
        ["torchvision 0.28.0 (pinned by vllm 0.32.0)", "!=3.14.1", "python 3.14.1"],
    ),
    (
        "python-3.14.1-torchvision-0.29.0",
        stack(python="3.14.1", torch="2.14.0", vllm="0.33.0"),
        "python -> torchvision",
        ["torchvision 0.29.0 (pinned by vllm 0.33.0)", "!=3.14.1", "python 3.14.1"],
    ),
    (
        "python-3.13-xformers-0.0.29.post2",
        stack(
            gpu=["H100"],
            driver="570.124.06",
            cuda=None,
            python="3.13",
            torch="2.6.0",
            torch_variant="cu124",
            vllm="0.8.0",
        ),
        "python -> xformers",
        ["xformers 0.0.29.post2 (pinned by vllm 0.8.0)", "no wheel for CPython 3.13", "python 3.13"],
    ),
    (
        "seed-cudart-version",
        SEED,
        "cuda",
        [
            "CUDA 12.1.105 is not a toolkit release",
            "CUDA Runtime (cudart)",
            "CUDA 12.1 Update 1",
            "cuda_12.1.1_530.30.02_linux.run",
            'set cuda: "12.1.1"',
        ],
    ),
    (
        "cudart-12.4.127",
        stack(gpu=["H100"], driver="550.54.15", cuda="12.4.127", torch="2.5.1", torch_variant="cu124"),
        "cuda",
        ["12.4.127", "CUDA 12.4 Update 1", 'set cuda: "12.4.1"'],
    ),
    ("cudart-13.0.48", stack(cuda="13.0.48"), "cuda", ["13.0.48", "CUDA 13.0 GA", 'set cuda: "13.0.0"']),
    (
        "cudart-12.0.146",
        stack(gpu=["H100"], driver="535.104.05", cuda="12.0.146", torch="2.4.0", torch_variant="cu121"),
        "cuda",
        ["12.0.146", "CUDA 12.0 Update 1", 'set cuda: "12.0.1"'],
    ),
    (
        "b300-toolkit-12.8-cannot-target-sm_103",
        stack(gpu=["NVIDIA B300"], driver="580.95.05", cuda="12.8", torch="2.8.0", torch_variant="cu128"),
        "gpu -> cuda",
        ["NVIDIA B300", "sm_103", "12.9", "toolkit uses CUDA 12.8"],
    ),
    (
        "b300-torch-cu126-has-no-blackwell-code",
        stack(gpu=["NVIDIA B300"], driver="580.95.05", cuda=None, torch="2.8.0", torch_variant="cu126"),
        "gpu -> cuda",
        ["NVIDIA B300", "torch 2.8.0+cu126", "CUDA 12.6"],
    ),
    (
        "b200-torch-2.7.0+cu126-has-no-sm_100",
        stack(gpu=["NVIDIA B200"], driver="580.95.05", cuda=None, torch="2.7.0", torch_variant="cu126"),
        "torch -> gpu",
        ["torch 2.7.0+cu126 is not compiled for NVIDIA B200 (sm_100)", "sm_50 sm_60 sm_70 sm_75 sm_80"],
    ),
    (
        "gb300-torch-2.7.1+cu126-has-no-sm_10x",
        stack(gpu=["NVIDIA GB300"], driver="580.95.05", cuda=None, torch="2.7.1", torch_variant="cu126"),
        "torch -> gpu",
        ["torch 2.7.1+cu126 is not compiled for NVIDIA GB300 (sm_103)", "no kernel image"],
    ),
    (
        "toolkit-12.3.2-driver-below-minor-compat",
        stack(gpu=["H100"], driver="520.61.05", cuda="12.3.2", torch="2.4.0", torch_variant="cu121"),
        "driver -> cuda",
        ["CUDA toolkit 12.3.2", "525.60.13", "driver 520.61.05"],
    ),
]


def validate(raw):
    return stack_declared.validate_stack(stack_spec.normalize_stack(raw), KB)


def test_at_least_forty_new_stacks():
    assert len(GOOD) + len(BAD) >= 40


@pytest.mark.parametrize("name,raw,warning_links", GOOD, ids=[row[0] for row in GOOD])
def test_good_stack(name, raw, warning_links):
    report = validate(raw)
    assert report["errors"] == [], report["errors"]
    assert sorted({warning["link"] for warning in report["warnings"]}) == sorted(warning_links), report["warnings"]


@pytest.mark.parametrize("name,raw,link,needles", BAD, ids=[row[0] for row in BAD])
def test_bad_stack(name, raw, link, needles):
    report = validate(raw)
    assert not report["compatible"]
    messages = [error["message"] for error in report["errors"] if error["link"] == link]
    assert messages, report["errors"]
    assert any(all(needle in message for needle in needles) for message in messages), messages


@pytest.mark.parametrize(
    "entry,cc",
    [
        ("NVIDIA GH200 480GB", "9.0"),
        ("NVIDIA L40", "8.9"),
        ("NVIDIA L40S", "8.9"),
        ("NVIDIA RTX 6000 Ada Generation", "8.9"),
        ("NVIDIA A40", "8.6"),
        ("NVIDIA GB200", "10.0"),
        ("NVIDIA B300", "10.3"),
        ("NVIDIA GB300", "10.3"),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "12.0"),
        ("NVIDIA H20", "9.0"),
        ("NVIDIA H200", "9.0"),
    ],
)
def test_gpus_resolve_to_nvidias_compute_capability(entry, cc):
    """The compute capabilities of https://developer.nvidia.com/cuda-gpus (H20: NVIDIA's MIG guide)."""
    resolved = validate(stack(gpu=[entry]))["resolved"]["gpus"][0]
    assert resolved["compute_capability"] == cc
    assert resolved["model"] != "NVIDIA L40" or entry == "NVIDIA L40", "L40S must not resolve to the L40 row"


def test_the_newer_driver_fix_is_the_rule_that_decides_it():
    """12.3.2 with driver 580.95.05 was refused ('install a newer driver'); now the backward-compatibility rule
    decides it and the unverified floor stays a warning."""
    report = validate(stack(gpu=["H100"], driver="580.95.05", cuda="12.3.2", torch="2.9.0", torch_variant="cu129"))
    assert "rule:driver_backward_compatibility" in {fact["id"] for fact in report["facts"]}
    assert any("12.3.2 is unverified" in warning["message"] for warning in report["warnings"])


def test_third_party_driver_floor_is_said():
    report = validate(stack(driver="610.43.02", cuda="13.3.0", torch="2.14.0", torch_variant="cu132"))
    assert any(
        "third-party copy" in warning["message"] and "13.3.0" in warning["message"] for warning in report["warnings"]
    )
    rows = {row["cuda_version"]: row for row in KB["cuda"]}
    assert rows["13.3.0"]["min_driver_status"] == rows["13.3.1"]["min_driver_status"] == "third-party"
    assert rows["13.2.2"]["min_driver_status"] == "table"


# ---------------------------------------------------------------------------------------------------
# PEP 440 ordering: the on-host comparator agrees with `packaging`


VERSIONS = [
    "0.10.0rc1",
    "0.10.0.post1",
    "0.10.0",
    "0.10.0.dev1",
    "0.10.0a1",
    "0.10.0b2",
    "0.10.0rc1.post1",
    "0.10.0rc1.dev2",
    "0.10.0.post1.dev3",
    "0.10.1",
    "0.10",
    "0.4.0.post1",
    "1.0",
    "0.9.0.1",
    "0.10.1.1",
    "2.13.0+cpu",
    "2.13.0",
    "0.6.6.post1",
    "580.159.04",
    "12.1.105",
    "12.1.1",
]


def test_version_order_is_pep_440():
    assert sorted(VERSIONS, key=stack_versions.version_key) == sorted(VERSIONS, key=Version)
    assert stack_versions.version_key("0.10.0rc1") < stack_versions.version_key("0.10.0.post1")
    assert compat_refresh.release_key("0.10.0rc1") < compat_refresh.release_key("0.10.0.post1")


@pytest.mark.parametrize(
    "specifier,version,expected",
    [
        (">=3.10,!=3.14.1", "3.14.1", False),
        (">=3.10,!=3.14.1", "3.14", True),
        (">=3.10,!=3.14.1", "3.14.2", True),
        ("~=2.8", "2.9.1", True),
        ("~=2.8.0", "2.9", False),
        ("<3.15,>=3.11", "3.15.0rc1", False),
        ("<3.15,>=3.11", "3.14.9", True),
        (">2.8", "2.8.post1", False),
        (">2.8", "2.8.1", True),
        ("==2.13.0", "2.13.0+cpu", True),
        ("==2.13.0+cpu", "2.13.0", False),
        (">=0.10.0", "0.10.0rc1", False),
        ("==2.13.*", "2.13.0", True),
    ],
)
def test_specifiers_follow_packaging(specifier, version, expected):
    from packaging.specifiers import SpecifierSet

    assert stack_versions.specifier_allows(specifier, version) is expected
    assert SpecifierSet(specifier, prereleases=True).contains(version) is expected


# ---------------------------------------------------------------------------------------------------
# The tables themselves


INTERNAL = re.compile(r"file id \d|\bids? \d{6,}|docs[- ]corpus|corpus excerpt")


def test_sources_cite_what_an_operator_can_open():
    for path in sorted(KB_DIR.glob("*.csv")):
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                for column, value in row.items():
                    assert not INTERNAL.search(value or ""), (path.name, column, value)


def test_companion_pins_match_the_vllm_metadata_sample():
    """vllm 0.32.0's METADATA (a stored sample) pins torchvision 0.28.0, torchaudio 2.11.0, flashinfer 0.7.0.post1."""
    metadata = compat_refresh.parse_metadata(
        (PROJECT_ROOT / "tests" / "unit" / "fixtures" / "compat" / "vllm-0.32.0.METADATA").read_text(encoding="utf-8")
    )
    rows = {row["companion"]: row for row in KB["vllm_companions"] if row["vllm_version"] == "0.32.0"}
    for companion in ("torchvision", "torchaudio", "flashinfer-python"):
        assert rows[companion]["requirement"] == compat_refresh.requirement(metadata, companion)
    assert rows["torchvision"]["requires_python"] == ">=3.10,!=3.14.1"
    assert "xformers" not in rows


def test_every_torch_variant_row_names_a_wheel_file_or_a_listing():
    for row in KB["torch_extra_variants"]:
        if row["status"] == "official":
            assert "download.pytorch.org/whl/" in row["source"] or "pytorch.org/get-started" in row["source"], row


@pytest.mark.parametrize("version,variant", [("2.11.0", "cu130"), ("2.8.0", "cu128")])
def test_arch_list_read_from_the_wheel_binary(version, variant):
    """Excerpts of the real libtorch_python.so of the PyPI wheels: 2.11.0's equals the capture of
    torch.cuda.get_arch_list() on the H200 device machine; in 2.8.0 the linker merged it into another literal."""
    excerpt = PROJECT_ROOT / "tests" / "unit" / "fixtures" / "compat" / f"libtorch_python-{version}-excerpt.bin"
    arch_list = compat_refresh.arch_list_from_binary(excerpt.read_bytes())
    row = [row for row in KB["torch_arch_lists"] if (row["torch_version"], row["variant"]) == (version, variant)][0]
    assert ";".join(arch_list) == row["arch_list"]
    if version == "2.11.0":
        assert "get_arch_list() of torch 2.11.0+cu130" in row["source"], "the real capture stays the source"


def test_an_ambiguous_binary_is_refused():
    with pytest.raises(compat_refresh.RefreshError):
        compat_refresh.arch_list_from_binary(b"\x00sm_80 sm_90\x00text\x00sm_70 sm_75\x00")
    with pytest.raises(compat_refresh.RefreshError):
        compat_refresh.arch_list_from_binary(b"no arch flags here sm_90\x00")
