"""The vllm@ unit's device policy, through systemd for real, on a lab host without a GPU.

Device nodes with the real H200's numbers (tests/fixtures/h200-proc-devices) are made with mknod; no driver
backs them, so open() fails with ENXIO where the unit's cgroup allows the node and with EPERM where it denies
it. A test instance of the real vllm@ unit (written by the role's own tasks) runs a probe instead of vLLM:
- with the unit's rules, on this kernel (no NVIDIA class in /proc/devices) every GPU node is denied;
- with the unit's class rules translated to the majors they name on the H200, every H200 GPU node is
  allowed and NVSwitch's is not; a glob class (char-me?) matches /proc/devices' `mem`.
Each time the result must equal what tests/unit/systemd_devices.py predicts from `systemctl cat`, the model
the unit test applies to the H200's /proc/devices. Then a crash loop must end `failed` (start-limit-hit),
and the unit's exposure (systemd-analyze security) must stay at or below 1.3.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import PROJECT_ROOT

from conftest import AnsibleRunner

# The model of systemd's rules lives beside the unit test that applies it to the H200.
sys.path.insert(0, str(PROJECT_ROOT / "tests" / "unit"))
from systemd_devices import denied_nodes, device_rules, listed_nodes  # noqa: E402

BIN = Path(sys.executable).parent
H200 = (PROJECT_ROOT / "tests" / "fixtures" / "h200-proc-devices").read_text()
UNIT = "vllm@devtest.service"
DROPIN = "/etc/systemd/system/vllm@devtest.service.d/zz-probe.conf"
PROBE = "/usr/local/lib/gpufleet-devtest/probe.py"
RESULT = "/run/vllm-devtest-probe.json"
MAX_EXPOSURE = 1.3
# Beside the H200's GPU nodes: NVSwitch's control node (major 239 on the H200: denied), a node of the `mem`
# class with a minor no driver serves, and one of a major nothing registers.
EXTRA_NODES = listed_nodes(
    "crw-rw-rw- 1 root root 239, 0 /dev/nvidia-nvswitchctl\n"
    "crw-rw-rw- 1 root root 1, 200 /dev/devtest-mem-200\n"
    "crw-rw-rw- 1 root root 200, 0 /dev/devtest-major-200\n"
)
NODES = listed_nodes(H200) + EXTRA_NODES
PROBE_SCRIPT = """import errno, json, os, sys
result = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDONLY))
        result[path] = "opened"
    except OSError as error:
        result[path] = errno.errorcode[error.errno]
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def sandbox_host(lab_inventory: Path, lab_hosts: dict[str, dict], ansible: AnsibleRunner) -> Iterator[str]:
    """The first lab host with the role's units, the test instance and the GPU nodes; all removed afterwards."""
    host = sorted(lab_hosts)[0]
    command = [
        str(BIN / "ansible-playbook"),
        "-i",
        str(lab_inventory),
        "-e",
        f"sandbox_host={host}",
        str(PROJECT_ROOT / "tests" / "integration" / "vllm_device_sandbox.yml"),
    ]
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:{os.environ['PATH']}"}
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    nodes = " ".join(
        f"mkdir -p {os.path.dirname(n.path)} && rm -f {n.path} && mknod -m 666 {n.path} c {n.major} {n.minor};"
        for n in NODES
    )
    ansible(host, "ansible.builtin.shell", f"{nodes} mkdir -p {os.path.dirname(PROBE)}")
    ansible(host, "ansible.builtin.copy", json.dumps({"dest": PROBE, "mode": "0644", "content": PROBE_SCRIPT}))
    yield host
    ansible(
        host,
        "ansible.builtin.shell",
        f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}; rm -rf /etc/systemd/system/vllm@devtest.service.d "
        f"/etc/vllm/devtest.env {os.path.dirname(PROBE)} {RESULT} {' '.join(n.path for n in NODES)}; "
        "systemctl daemon-reload",
    )


def shell(ansible: AnsibleRunner, host: str, script: str) -> str:
    return ansible(host, "ansible.builtin.shell", script)[host]["stdout"]


def probe(ansible: AnsibleRunner, host: str, rules: list[str]) -> tuple[dict[str, str], str]:
    """Runs the probe as the test instance with these extra [Service] lines; its errno per node, and the unit text."""
    argv = " ".join([PROBE] + [n.path for n in NODES] + ["/dev/null"])
    dropin = (
        "\n".join(
            [
                "[Service]",
                "ExecStart=",
                f"ExecStart=/usr/bin/python3 {argv}",
                "Restart=no",
                f"StandardOutput=truncate:{RESULT}",
                *rules,
            ]
        )
        + "\n"
    )
    ansible(host, "ansible.builtin.copy", json.dumps({"dest": DROPIN, "mode": "0644", "content": dropin}))
    shell(
        ansible,
        host,
        f"systemctl daemon-reload && systemctl reset-failed {UNIT}; systemctl start {UNIT} && "
        f"while systemctl is-active -q {UNIT}; do sleep 0.2; done",
    )
    return json.loads(shell(ansible, host, f"cat {RESULT}")), shell(ansible, host, f"systemctl cat {UNIT}")


def expected(unit_text: str, proc_devices: str) -> dict[str, str]:
    denied = {node.path for node in denied_nodes(unit_text, proc_devices, NODES)}
    return {**{node.path: "EPERM" if node.path in denied else "ENXIO" for node in NODES}, "/dev/null": "opened"}


def test_unit_rules_deny_every_gpu_node_where_no_driver_registered_them(
    sandbox_host: str, ansible: AnsibleRunner
) -> None:
    opened, unit_text = probe(ansible, sandbox_host, [])
    proc_devices = shell(ansible, sandbox_host, "cat /proc/devices")
    print(f"{sandbox_host}, the unit's rules {device_rules(unit_text)[1]}: {opened}")
    assert opened == expected(unit_text, proc_devices)
    assert all(opened[node.path] == "EPERM" for node in listed_nodes(H200))


def test_unit_rules_at_the_h200s_majors_allow_every_gpu_node(sandbox_host: str, ansible: AnsibleRunner) -> None:
    _policy, rules = device_rules(shell(ansible, sandbox_host, f"systemctl cat {UNIT}"))
    majors = sorted(
        {
            node.major
            for node in listed_nodes(H200)
            if not denied_nodes(
                "DevicePolicy=closed\n" + "".join(f"DeviceAllow={rule} rw\n" for rule in rules), H200, [node]
            )
        }
    )
    translated = ["DeviceAllow="] + [f"DeviceAllow=char-{major} rw" for major in majors] + ["DeviceAllow=char-me? rw"]
    opened, unit_text = probe(ansible, sandbox_host, translated)
    proc_devices = shell(ansible, sandbox_host, "cat /proc/devices")
    print(f"{sandbox_host}, the H200's majors {majors} and char-me?: {opened}")
    assert majors == [195, 238, 241]
    assert opened == expected(unit_text, proc_devices)
    assert all(opened[node.path] == "ENXIO" for node in listed_nodes(H200))
    assert opened["/dev/nvidia-nvswitchctl"] == "EPERM" and opened["/dev/devtest-major-200"] == "EPERM"
    assert opened["/dev/devtest-mem-200"] == "ENXIO"


def test_crash_loop_ends_failed_at_the_start_limit(sandbox_host: str, ansible: AnsibleRunner) -> None:
    # The unit's own Restart=always and start limit; only the command (it crashes) and the pause are the test's.
    dropin = "[Service]\nExecStart=\nExecStart=/bin/false\nRestartSec=200ms\n"
    ansible(sandbox_host, "ansible.builtin.copy", json.dumps({"dest": DROPIN, "mode": "0644", "content": dropin}))
    state = shell(
        ansible,
        sandbox_host,
        f"systemctl daemon-reload && systemctl reset-failed {UNIT}; systemctl start {UNIT}; "
        f"for i in $(seq 100); do systemctl is-failed -q {UNIT} && break; sleep 0.2; done; sleep 1; "
        f"systemctl show -p ActiveState,NRestarts,StartLimitBurst {UNIT}; "
        f"journalctl -u {UNIT} -o cat --no-pager | grep -c 'Start request repeated too quickly'",
    )
    print(f"{sandbox_host} {UNIT} after a crash loop: {state.split()}")
    properties = dict(line.split("=", 1) for line in state.splitlines() if "=" in line)
    # It stays failed (no further restart a second later): systemd refused the restart after the burst.
    assert properties["ActiveState"] == "failed"
    assert properties["NRestarts"] == properties["StartLimitBurst"] == "5"
    assert state.splitlines()[-1] != "0"


def test_exposure_is_at_most_todays(sandbox_host: str, ansible: AnsibleRunner) -> None:
    output = shell(ansible, sandbox_host, f"rm -f {DROPIN}; systemctl daemon-reload; systemd-analyze security {UNIT}")
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", output)
    assert found, output[-2000:]
    print(f"{sandbox_host} {UNIT}: exposure {found.group(1)}")
    assert float(found.group(1)) <= MAX_EXPOSURE
