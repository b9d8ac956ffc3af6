"""The GPU health gate on a lab node: an XID 79 in this boot's kernel log (the simulated GPU's driver line,
written by the node's gpufleet-simgpuctl) keeps a stopped vLLM instance stopped with the reason, and drift's
gpu_health layer reports it; with the log cleared the serve layer starts the instance again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpufleet import PROJECT_ROOT
from tests.integration.conftest import AnsibleRunner
from gpufleet.drift import read_report

CTL = "/usr/local/sbin/gpufleet-simgpuctl"
BIN = Path(sys.executable).parent


def shell(ansible: AnsibleRunner, node: str, command: str) -> str:
    return ansible(node, "ansible.builtin.shell", command)[node]["stdout"]


def serve(inventory: Path, node: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "--limit", node, "playbooks/serve.yml"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=900,
        check=False,
    )


def test_an_xid_keeps_the_instance_stopped_and_drift_reports_it(
    lab_inventory: Path, lab_hosts: dict[str, dict], ansible: AnsibleRunner, tmp_path: Path
) -> None:
    node = sorted(lab_hosts)[0]
    shell(ansible, node, f"systemctl stop vllm@greedy.service && {CTL} xid 79")
    try:
        gated = serve(lab_inventory, node)
        assert gated.returncode != 0, gated.stdout[-3000:]
        assert "the GPUs are not fit to serve" in gated.stdout and "XID 79 on the GPU at PCI 0000:00:06" in gated.stdout
        assert "GPU has fallen off the bus" in gated.stdout
        assert shell(ansible, node, "systemctl is-active vllm@greedy.service || true") == "inactive"

        drift = subprocess.run(
            [str(BIN / "gpufleet"), "drift", "-i", str(lab_inventory), "--limit", node, "--layers", "gpu_health"],
            capture_output=True,
            text=True,
            cwd=PROJECT_ROOT,
            env={**os.environ, "GPUFLEET_RUNS_DIR": str(tmp_path)},
            timeout=600,
            check=False,
        )
        assert drift.returncode == 2, drift.stdout + drift.stderr
        report = read_report(next(tmp_path.glob("*-drift")) / "drift")
        layer = report.nodes[node].layers["gpu_health"]
        assert layer.status == "drifted"
        assert [(item.field, item.expected) for item in layer.drift] == [("xid 79", "none since boot")]
    finally:
        shell(ansible, node, f"{CTL} xid-clear")
    restored = serve(lab_inventory, node)
    assert restored.returncode == 0, restored.stdout[-3000:]
    assert shell(ansible, node, "systemctl is-active vllm@greedy.service") == "active"
