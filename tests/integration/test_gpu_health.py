"""The GPU health gate and the GPU watchdog on a lab node. An XID 79 (the simulated GPU's driver line in the kernel
log and its NVML event, raised by the node's gpufleet-simgpuctl) makes the watchdog cordon the node on its own,
with no gpufleet command run: its proxy answers 503, doctor names the watchdog's cordon first, and only
`gpufleet uncordon` puts it back. The health gate keeps a stopped vLLM instance stopped with the reason, and
drift's gpu_health layer reports it; with the log cleared the serve layer starts the instance again. A double-bit
ECC error on GPU 1 stops only the instance on GPU 1."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gpufleet import PROJECT_ROOT
from test_drift_support import gpufleet
from tests.integration.conftest import AnsibleRunner
from gpufleet.drift import read_report

CTL = "/usr/local/sbin/gpufleet-simgpuctl"
BIN = Path(sys.executable).parent
PROXY_HEALTH = "curl -sk -o /dev/null -w '%{http_code}' https://127.0.0.1/health"
# The bound this suite holds the watchdog to: from the fault to the cordon (or the stop) on the node.
WATCHDOG_SECONDS = 10


def wait_on_node(ansible: AnsibleRunner, node: str, command: str, expected: str) -> float:
    """Seconds until `command` prints `expected` on the node (checked every half second), within the bound."""
    started = time.monotonic()
    while True:
        seen = shell(ansible, node, command)
        waited = time.monotonic() - started
        if seen == expected:
            return waited
        assert waited < WATCHDOG_SECONDS, f"{command!r} printed {seen!r} after {waited:.1f} s, not {expected!r}"
        time.sleep(0.5)


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


def test_gpu_faults_are_acted_on_by_the_watchdog_gated_by_serve_and_reported_by_drift(
    lab_inventory: Path, lab_hosts: dict[str, dict], ansible: AnsibleRunner, tmp_path: Path
) -> None:
    node = sorted(lab_hosts)[0]
    assert shell(ansible, node, PROXY_HEALTH) == "200"
    # A double-bit ECC error on GPU 1 stops only the instance on GPU 1 (greedy, CUDA_VISIBLE_DEVICES=1). The second
    # simulated GPU exists for this case: the watchdog learns the GPUs at its start, as after the node boots.
    shell(ansible, node, f"{CTL} gpu-count 2 && systemctl restart gpufleet-gpu-watchdog && sleep 2")
    try:
        shell(ansible, node, f"{CTL} ecc-errors --gpu 1 1")
        waited = wait_on_node(ansible, node, "systemctl is-active vllm@greedy.service || true", "inactive")
        print(f"watchdog: stopped vllm@greedy {waited:.1f} s after the double-bit error")
        assert shell(ansible, node, "systemctl is-active vllm@main.service") == "active"
        assert shell(ansible, node, f"test -e /etc/gpufleet/cordon && echo cordoned || {PROXY_HEALTH}") == "200"
        record = json.loads(shell(ansible, node, "tail -n 1 /var/lib/gpufleet/gpu-watchdog/faults.jsonl"))
        assert (record["kind"], record["gpu"], record["action"]) == ("double_bit_ecc", 1, "stop_instances")
        assert record["done"] == "stopped vllm@greedy.service"
    finally:
        shell(
            ansible, node, f"{CTL} ecc-errors --gpu 1 0 && {CTL} gpu-count 1 && systemctl restart gpufleet-gpu-watchdog"
        )

    shell(ansible, node, f"sleep 2 && {CTL} xid 79")
    try:
        # XID 79, with no gpufleet command run: the node is cordoned with the XID as its reason (503 at its proxy)
        # and the instance on GPU 0 stops.
        waited = wait_on_node(ansible, node, f"test -e /etc/gpufleet/cordon && {PROXY_HEALTH} || echo no", "503")
        print(f"watchdog: cordoned {waited:.1f} s after the XID")
        cordon = json.loads(shell(ansible, node, "cat /etc/gpufleet/cordon"))
        assert cordon["reason"].startswith("gpu-watchdog: XID 79 on GPU 0 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
        wait_on_node(ansible, node, "systemctl is-active vllm@main.service || true", "inactive")
        doctor = gpufleet(tmp_path, "doctor", "-i", str(lab_inventory), "--limit", node)
        assert doctor.returncode == 1, doctor.stdout + doctor.stderr
        assert doctor.stdout.splitlines()[1].startswith("1. watchdog-cordoned"), doctor.stdout

        # The health gate keeps the stopped instances stopped, with the reason.
        gated = serve(lab_inventory, node)
        assert gated.returncode != 0, gated.stdout[-3000:]
        assert "the GPUs are not fit to serve" in gated.stdout and "XID 79 on the GPU at PCI 0000:00:06" in gated.stdout
        assert "GPU has fallen off the bus" in gated.stdout
        assert shell(ansible, node, "systemctl is-active vllm@greedy.service || true") == "inactive"

        drift = gpufleet(tmp_path, "drift", "-i", str(lab_inventory), "--limit", node, "--layers", "gpu_health")
        assert drift.returncode == 2, drift.stdout + drift.stderr
        report = read_report(next(tmp_path.glob("*-drift")) / "drift")
        layer = report.nodes[node].layers["gpu_health"]
        assert layer.status == "drifted"
        assert [(item.field, item.expected) for item in layer.drift] == [("xid 79", "none since boot")]
    finally:
        shell(ansible, node, f"{CTL} xid-clear")
    restored = serve(lab_inventory, node)
    assert restored.returncode == 0, restored.stdout[-3000:]
    assert shell(ansible, node, "systemctl is-active vllm@greedy.service vllm@main.service") == "active\nactive"
    # Serving again does not take the cordon away: only the operator does.
    assert shell(ansible, node, PROXY_HEALTH) == "503"
    uncordoned = gpufleet(tmp_path, "uncordon", "-i", str(lab_inventory), "--limit", node)
    assert uncordoned.returncode == 0, uncordoned.stdout + uncordoned.stderr
    assert shell(ansible, node, PROXY_HEALTH) == "200"
