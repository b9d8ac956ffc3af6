"""gpufleet doctor on a lab node broken for real, one break at a time, each restored afterwards.

Breaks: the driver's libraries over an older loaded module and a GPU off the bus (the simulated GPU, through
the node's gpufleet-simgpuctl), the model directory an instance serves removed, and the proxy sending vLLM a key
it does not take (nginx reloaded with it). Each time doctor must name that cause first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet import PROJECT_ROOT
from tests.integration.conftest import AnsibleRunner

CTL = "/usr/local/sbin/gpufleet-simgpuctl"
DESCRIPTION = "/etc/gpufleet-simgpu/gpus.json"
PROXY_CONF = "/etc/nginx/conf.d/gpufleet-inference.conf"


@pytest.fixture(scope="module")
def node(lab_hosts: dict[str, dict]) -> str:
    return sorted(lab_hosts)[0]


def doctor(inventory: Path, node: str) -> tuple[int, dict[str, Any]]:
    result = subprocess.run([sys.executable, "-m", "gpufleet", "doctor", "-i", str(inventory), "--limit", node,
                             "--json"], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600, check=False)
    assert result.returncode in (0, 1), f"doctor failed (rc {result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result.returncode, json.loads(result.stdout)


def shell(ansible: AnsibleRunner, node: str, command: str) -> str:
    return ansible(node, "ansible.builtin.shell", command)[node]["stdout"]


@pytest.fixture
def saved_gpu(ansible: AnsibleRunner, node: str) -> Iterator[None]:
    shell(ansible, node, f"cp -p {DESCRIPTION} /root/h5-gpus.json.saved")
    yield
    shell(ansible, node, f"mv /root/h5-gpus.json.saved {DESCRIPTION}")


def first(report: dict[str, Any]) -> dict[str, Any]:
    assert report["findings"], json.dumps(report["evidence"], indent=1)[-4000:]
    return report["findings"][0]


def test_a_healthy_node_has_no_finding(lab_inventory: Path, node: str) -> None:
    rc, report = doctor(lab_inventory, node)
    assert (rc, report["findings"]) == (0, [])


def test_driver_library_mismatch(lab_inventory: Path, ansible: AnsibleRunner, node: str, saved_gpu: None) -> None:
    shell(ansible, node, f"{CTL} mismatch 570.133.20")
    rc, report = doctor(lab_inventory, node)
    finding = first(report)
    assert rc == 1 and finding["id"] == "driver-library-mismatch", report["findings"]
    assert "Driver/library version mismatch" in finding["evidence"] and "reboot" in finding["fix"]


def test_lost_gpu(lab_inventory: Path, ansible: AnsibleRunner, node: str, saved_gpu: None) -> None:
    shell(ansible, node, f"{CTL} lose --gpu 0")
    finding = first(doctor(lab_inventory, node)[1])
    assert finding["id"] == "gpu-lost" and "lost" in finding["evidence"]


def test_model_directory_removed(lab_inventory: Path, ansible: AnsibleRunner, node: str) -> None:
    model = "/var/lib/gpufleet/models/tiny-qwen2"
    shell(ansible, node, f"mv {model} {model}.h5-removed")
    try:
        finding = first(doctor(lab_inventory, node)[1])
    finally:
        shell(ansible, node, f"mv {model}.h5-removed {model}")
    assert finding["id"] == "model-missing" and model in finding["evidence"] and "vllm@main" in finding["evidence"]


def test_wrong_key_between_proxy_and_vllm(lab_inventory: Path, ansible: AnsibleRunner, node: str) -> None:
    # The proxy's key for vllm@main (the node's vllm_service_api_key) replaced by another, nginx reloaded. The
    # key is read into a variable on the node: on a command line it would land in the node's journal (the shell
    # module logs its arguments there), where test_secrets rightly finds it.
    read_key = "key=$(sed -n 's/^VLLM_API_KEY=\"\\(.*\\)\"$/\\1/p' /etc/vllm/main.env) && test -n \"$key\""
    shell(ansible, node, f"{read_key} && cp -p {PROXY_CONF} /root/h5-proxy.conf.saved && "
                         f"sed -i \"s/Bearer $key\\\"/Bearer wrong-key\\\"/\" {PROXY_CONF} && "
                         f"! grep -q \"Bearer $key\\\"\" {PROXY_CONF} && systemctl reload nginx")
    try:
        finding = first(doctor(lab_inventory, node)[1])
    finally:
        shell(ansible, node, f"mv /root/h5-proxy.conf.saved {PROXY_CONF} && systemctl reload nginx")
    assert finding["id"] == "proxy-key-rejected" and "401" in finding["evidence"], finding
