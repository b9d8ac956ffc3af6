"""gpufleet doctor on a lab node broken for real, one break at a time, each restored afterwards.

Breaks: the driver's libraries over an older loaded module and a GPU off the bus (the simulated GPU, through
the node's gpufleet-simgpuctl), the model directory an instance serves removed, the proxy sending vLLM a key
it does not take (nginx reloaded with it), the serving venv's torch swapped for PyPI's default (CUDA) build, and
an instance configured for more KV cache than the node's memory. Each time doctor must name that cause first.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_driver_support import play

from gpufleet import PROJECT_ROOT
from gpufleet.lab import mirror
from tests.integration.conftest import AnsibleRunner

CTL = "/usr/local/sbin/gpufleet-simgpuctl"
DESCRIPTION = "/etc/gpufleet-simgpu/gpus.json"
PROXY_CONF = "/etc/nginx/conf.d/gpufleet-inference.conf"
VENV = "/opt/gpufleet/venvs/current"
PIP = f"PIP_CONFIG_FILE=/dev/null {VENV}/bin/python -m pip install --quiet --no-deps --disable-pip-version-check"
# PyPI's default build of a torch release the machine's pip reaches (its CUDA 13 build), over the lab stack's +cpu.
OTHER_TORCH = "2.14.1"


@pytest.fixture(scope="module")
def node(lab_hosts: dict[str, dict]) -> str:
    return sorted(lab_hosts)[0]


def doctor(inventory: Path, node: str) -> tuple[int, dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", "doctor", "-i", str(inventory), "--limit", node, "--json"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=600,
        check=False,
    )
    assert result.returncode in (0, 1), (
        f"doctor failed (rc {result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    )
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
    read_key = 'key=$(sed -n \'s/^VLLM_API_KEY="\\(.*\\)"$/\\1/p\' /etc/vllm/main.env) && test -n "$key"'
    shell(
        ansible,
        node,
        f"{read_key} && cp -p {PROXY_CONF} /root/h5-proxy.conf.saved && "
        f'sed -i "s/Bearer $key\\"/Bearer wrong-key\\"/" {PROXY_CONF} && '
        f'! grep -q "Bearer $key\\"" {PROXY_CONF} && systemctl reload nginx',
    )
    try:
        finding = first(doctor(lab_inventory, node)[1])
    finally:
        shell(ansible, node, f"mv /root/h5-proxy.conf.saved {PROXY_CONF} && systemctl reload nginx")
    assert finding["id"] == "proxy-key-rejected" and "401" in finding["evidence"], finding


@pytest.fixture
def other_torch(tmp_path: Path) -> Iterator[str]:
    """PyPI's torch OTHER_TORCH wheel for the nodes' Python, on the lab mirror; its URL path."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--python-version",
            "3.11",
            "--platform",
            "manylinux_2_28_x86_64",
            "--dest",
            str(tmp_path),
            f"torch=={OTHER_TORCH}",
        ],
        check=True,
        timeout=600,
    )
    wheel = next(tmp_path.glob(f"torch-{OTHER_TORCH}-*.whl"))
    url_path = mirror.publish(wheel, f"_tests/doctor/{wheel.name}")
    yield url_path
    published = mirror.mirror_dir() / url_path.lstrip("/")
    published.unlink(missing_ok=True)
    published.parent.rmdir()


def lab_torch_wheel() -> str:
    """The URL path of the torch wheel the lab venv's lock pins, in the mirror's wheelhouse."""
    lock = next((PROJECT_ROOT / "inventories" / "lab" / "locks").glob("*.lock"))
    pinned = re.search(r"(?m)^torch==(\S+)", lock.read_text()).group(1)
    wheel = next((mirror.mirror_dir() / "wheels" / lock.stem).glob(f"torch-{pinned}-*.whl"))
    return "/" + str(wheel.relative_to(mirror.mirror_dir()))


@pytest.mark.slow
def test_torch_swapped_for_another_variant(
    lab_inventory: Path, lab_hosts: dict[str, dict], ansible: AnsibleRunner, node: str, other_torch: str
) -> None:
    # What `pip install torch` does to a venv: PyPI's build replaces the variant index's, without its nvidia-*
    # wheels (--no-deps), so it does not even import. The instances keep the torch they loaded.
    url = lab_hosts[node]["gpufleet_mirror_url"]
    restarts = shell(ansible, node, "systemctl show -p NRestarts --value vllm@main vllm@greedy")
    shell(ansible, node, f"{PIP} {url}{other_torch}")
    try:
        finding = first(doctor(lab_inventory, node)[1])
    finally:
        shell(ansible, node, f"{PIP} --force-reinstall {url}{lab_torch_wheel()}")
        # The torch put back is the lock's, but installed anew (its RECORD differs): the kernel marker's record of
        # torch's identity is refreshed by the kernels layer, as after any reinstall by hand, or the next
        # provision of this node would report that refresh as a change.
        refreshed = play(lab_inventory, node, "site.yml", "--tags", "kernels")
        assert refreshed.rc == 0, refreshed.describe()
    assert finding["id"] == "torch-variant-changed", finding
    assert finding["evidence"] == (
        f"the serving venv has torch {OTHER_TORCH} (PyPI's default build, from no variant "
        "index, not importable) but the stack declares variant cpu"
    )
    assert "reinstall the venv from its lock" in finding["fix"]
    assert shell(ansible, node, f"{VENV}/bin/python -c 'import torch; print(torch.__version__)'") == "2.13.0+cpu"
    assert shell(ansible, node, "systemctl show -p NRestarts --value vllm@main vllm@greedy") == restarts


def main_port() -> int:
    serve = yaml.safe_load((PROJECT_ROOT / "inventories/lab/group_vars/all/serve.yml").read_text())
    return next(item["port"] for item in serve["vllm_service_instances"] if item["name"] == "main")


@pytest.mark.slow
def test_an_instance_configured_beyond_the_node_memory(lab_inventory: Path, ansible: AnsibleRunner, node: str) -> None:
    # More KV cache than the node has: vLLM's CPU worker refuses it at start, and systemd restarts it in a loop.
    env = "/etc/vllm/main.env"
    shell(
        ansible,
        node,
        f"cp -p {env} /root/h13-main.env.saved && "
        f"sed -i 's/^VLLM_CPU_KVCACHE_SPACE=.*/VLLM_CPU_KVCACHE_SPACE=\"4096\"/' {env} && "
        f"grep -q '^VLLM_CPU_KVCACHE_SPACE=\"4096\"' {env} && systemctl restart vllm@main && "
        "for i in $(seq 100); do journalctl -b -u vllm@main -n 200 -o cat -q | "
        "grep -q 'less than requested memory for kv' && exit 0; sleep 3; done; exit 1",
    )
    try:
        finding = first(doctor(lab_inventory, node)[1])
    finally:
        shell(
            ansible,
            node,
            f"mv /root/h13-main.env.saved {env} && systemctl restart vllm@main && "
            f"for i in $(seq 200); do curl -sf -o /dev/null http://127.0.0.1:{main_port()}/health "
            "&& exit 0; sleep 3; done; exit 1",
        )
    assert finding["id"] == "kv-cache-beyond-memory", finding
    assert "(4096.0 GiB)" in finding["evidence"] and "VLLM_CPU_KVCACHE_SPACE" in finding["fix"]
