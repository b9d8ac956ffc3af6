"""The vllm@ unit, rendered by Ansible from the role's template and defaults, can open every GPU node of the
real H200: its DeviceAllow= rules are resolved against the H200's /proc/devices (tests/fixtures), the way
systemd resolves them when an instance starts. The unit of before issue 11 (char-nvidia-frontend, a class
today's open kernel modules do not register) fails this test with /dev/nvidia0 and /dev/nvidiactl denied.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpufleet import PROJECT_ROOT
from systemd_devices import denied_nodes, device_rules, listed_nodes

ROLE = PROJECT_ROOT / "roles" / "vllm_service"
UNIT_TEMPLATE = ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.j2"
ENV_TEMPLATE = ROLE / "templates" / "etc" / "vllm" / "instance.env.j2"
H200 = (PROJECT_ROOT / "tests" / "fixtures" / "h200-proc-devices").read_text()
INSTANCE = {"name": "main", "model": "/var/lib/gpufleet/models/m", "port": 8000, "gpus": [0]}
# The instance as the role's tasks see it: every key filled in from the defaults.
FIRST = "{{ __vllm_service_instances[0] }}"


def render(template: Path, **extra: object) -> str:
    """The template rendered by `ansible -m template` with the role's defaults and vars (extra vars win)."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-render-") as tree:
        variables = Path(tree) / "extra.json"
        variables.write_text(json.dumps(extra))
        out = Path(tree) / "out"
        command = [
            str(Path(sys.executable).parent / "ansible"),
            "localhost",
            "-c",
            "local",
            "-m",
            "template",
            "-a",
            f"src={template} dest={out} mode=0600",
            "-e",
            f"@{ROLE / 'defaults' / 'main.yml'}",
            "-e",
            f"@{ROLE / 'vars' / 'main.yml'}",
            "-e",
            f"@{variables}",
        ]
        result = subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, check=False)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        return out.read_text()


def test_the_fixture_holds_every_gpu_node_of_the_capture() -> None:
    paths = [node.path for node in listed_nodes(H200)]
    assert paths == [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    ]


def test_rendered_unit_allows_every_h200_gpu_node() -> None:
    unit = render(UNIT_TEMPLATE, vllm_service_instances=[INSTANCE])
    policy, rules = device_rules(unit)
    assert policy == "closed" and rules
    assert [node.path for node in denied_nodes(unit, H200, listed_nodes(H200))] == []


def test_rendered_unit_denies_what_cuda_does_not_open() -> None:
    # NVSwitch and NVLink management nodes (fabric manager's) stay closed, and so does an unknown major.
    unit = render(UNIT_TEMPLATE, vllm_service_instances=[INSTANCE])
    others = listed_nodes(
        "crw-rw-rw- 1 root root 239, 0 /dev/nvidia-nvswitchctl\n"
        "crw-rw-rw- 1 root root 240, 0 /dev/nvidia-nvlink\n"
        "crw-rw-rw- 1 root root 200, 0 /dev/other\n"
    )
    assert [node.path for node in denied_nodes(unit, H200, others)] == [
        "/dev/nvidia-nvswitchctl",
        "/dev/nvidia-nvlink",
        "/dev/other",
    ]


@pytest.mark.parametrize(
    "registered",
    ["195 nvidia-frontend\n238 nvidia-uvm\n", "195 nvidia\n195 nvidiactl\n511 nvidia-uvm\n"],
    ids=["proprietary-before-r560", "open-module-other-uvm-major"],
)
def test_rendered_unit_allows_gpus_of_other_driver_branches(registered: str) -> None:
    unit = render(UNIT_TEMPLATE, vllm_service_instances=[INSTANCE])
    uvm = int(registered.splitlines()[-1].split()[0])
    nodes = listed_nodes(
        f"crw-rw-rw- 1 root root 195, 0 /dev/nvidia0\ncrw-rw-rw- 1 root root 195, 255 /dev/nvidiactl\n"
        f"crw-rw-rw- 1 root root {uvm}, 0 /dev/nvidia-uvm\n"
    )
    assert denied_nodes(unit, "Character devices:\n" + registered, nodes) == []


def test_unit_orders_after_the_device_nodes_and_the_driver_daemons_and_limits_starts() -> None:
    unit = render(UNIT_TEMPLATE, vllm_service_instances=[INSTANCE])
    lines = unit.splitlines()
    assert "Requires=vllm-nvidia-devices.service" in lines
    after = next(line for line in lines if line.startswith("After=")).split("=", 1)[1].split()
    assert {"vllm-nvidia-devices.service", "nvidia-persistenced.service", "nvidia-fabricmanager.service"} <= set(after)
    # Five starts within five slowest allowed starts (health timeout 1800 s + RestartSec 10 s).
    assert "StartLimitBurst=5" in lines and "StartLimitIntervalSec=9050" in lines


def test_a_stop_while_starting_ends_the_instance_at_once_and_inactive() -> None:
    # vLLM loses a SIGTERM that arrives while it starts and the stop waited out TimeoutStopSec, ending `failed`;
    # SIGINT to the main process only ends it within seconds with exit 1, counted clean (the lab case of it is
    # test_serve's stopped-while-it-starts, make test-slow).
    lines = render(UNIT_TEMPLATE, vllm_service_instances=[INSTANCE]).splitlines()
    assert {"KillSignal=SIGINT", "KillMode=mixed", "SuccessExitStatus=1"} <= set(lines)


def test_the_venvs_tools_come_first_on_the_services_path() -> None:
    # On the H200, flashinfer's first warm-up builds kernels with ninja from the venv; under systemd's default
    # PATH the engine died with "No such file or directory: 'ninja'" (tests/fixtures/h200-real/README.md).
    unit = render(UNIT_TEMPLATE, vllm_service_instances=[INSTANCE])
    (path,) = [line.split("=", 2)[2] for line in unit.splitlines() if line.startswith("Environment=PATH=")]
    assert path.split(":")[0] == "/opt/gpufleet/venvs/current/bin" and "/usr/bin" in path.split(":")


def _env(text: str) -> dict[str, str]:
    return {
        key: value.strip('"')
        for key, _, value in (line.partition("=") for line in text.splitlines() if line and not line.startswith("#"))
    }


def instance_env(instance: dict, allow: list[str], **extra: object) -> dict[str, str]:
    """The environment file of one instance under the given address allow-list, as a mapping."""
    return _env(
        render(
            ENV_TEMPLATE,
            vllm_service_instances=[instance],
            vllm_service_instance=FIRST,
            vllm_service_ip_address_allow=allow,
            **extra,
        )
    )


# 127.x addresses are loopback too: the pattern's `\\.` in a templated string never matched a dot before.
@pytest.mark.parametrize("allow", [["localhost"], ["127.0.0.1/8", "::1"]], ids=["localhost", "loopback-addresses"])
def test_collectives_stay_on_loopback_when_only_loopback_is_allowed(allow: list[str]) -> None:
    env = instance_env(INSTANCE, allow)
    assert {
        key: env.get(key) for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE", "VLLM_HOST_IP")
    } == {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "VLLM_HOST_IP": "127.0.0.1"}


@pytest.mark.parametrize("allow", [[], ["localhost", "10.0.0.0/8"]], ids=["all-allowed", "a-real-network"])
def test_collectives_keep_their_interface_when_the_network_is_allowed(allow: list[str]) -> None:
    env = instance_env(INSTANCE, allow)
    assert "NCCL_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in env


# What role ray_cluster's client entry point gives the head of a two-member cluster (cluster interface eth1).
RAY_CLIENT = {
    "address": "10.254.0.1:6379",
    "node_address": "10.254.0.1",
    "allowed": ["localhost", "10.254.0.0/30"],
    "socket_ifname": "eth1",
    "user": "vllm",
    "group": "vllm",
    "home": "/var/lib/vllm",
}
ON_RAY = {**INSTANCE, "gpus": [0, 1], "tensor_parallel_size": 2, "pipeline_parallel_size": 2}
ON_RAY["distributed_executor_backend"] = "ray"


def test_an_instance_on_ray_joins_its_cluster_not_loopback() -> None:
    # The unit is loopback-only, yet an instance spanning a Ray cluster needs its GCS (RAY_ADDRESS: the unit's
    # private /tmp hides the address Ray would look up), its own cluster address (vLLM refuses a driver address
    # that no node has) and the cluster's interface, which vLLM copies to every Ray worker in NCCL_*.
    env = instance_env(ON_RAY, ["localhost"], ray_cluster_client=RAY_CLIENT)
    assert {
        key: env.get(key)
        for key in ("RAY_ADDRESS", "VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE")
    } == {
        "RAY_ADDRESS": "10.254.0.1:6379",
        "VLLM_HOST_IP": "10.254.0.1",
        "NCCL_SOCKET_IFNAME": "eth1",
        "GLOO_SOCKET_IFNAME": "eth1",
        "NCCL_IB_DISABLE": None,
    }
    # vLLM reads there what it does not copy to its workers (the role's file, below).
    assert env["VLLM_CONFIG_ROOT"] == "/etc/vllm-ray"
    no_ifname = instance_env(ON_RAY, ["localhost"], ray_cluster_client={**RAY_CLIENT, "socket_ifname": ""})
    assert "NCCL_SOCKET_IFNAME" not in no_ifname and no_ifname["RAY_ADDRESS"] == "10.254.0.1:6379"


def test_an_instance_on_ray_may_reach_the_clusters_members_and_see_its_raylet() -> None:
    dropin = ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.d" / "gpufleet.conf.j2"
    facts = {"memtotal_mb": 24000}
    on_ray = render(
        dropin,
        vllm_service_instances=[ON_RAY],
        vllm_service_instance=FIRST,
        ansible_facts=facts,
        ray_cluster_client=RAY_CLIENT,
    ).splitlines()
    assert [line for line in on_ray if line.startswith("IPAddress")] == ["IPAddressAllow=localhost 10.254.0.0/30"]
    # Ray's driver looks for its member's raylet among the node's processes.
    assert "ProtectProc=default" in on_ray
    # It runs as the cluster's account, whose raylets run its workers, in that account's home.
    assert [line for line in on_ray if line.split("=")[0] in IDENTITY] == [
        "DynamicUser=no",
        "User=vllm",
        "Group=vllm",
        "CacheDirectory=",
        "WorkingDirectory=/var/lib/vllm",
        "Environment=HOME=/var/lib/vllm",
        "ReadWritePaths=/var/lib/vllm",
        # The unit's compile caches and the ExecPaths= of its cache directory, which does not exist here: the start
        # failed at its namespace (status 226) until the drop-in emptied it.
        "Environment=TORCHINDUCTOR_CACHE_DIR=/var/lib/vllm/.cache/torchinductor",
        "Environment=TRITON_CACHE_DIR=/var/lib/vllm/.cache/triton",
        "ExecPaths=",
    ]
    single = render(dropin, vllm_service_instances=[INSTANCE], vllm_service_instance=FIRST, ansible_facts=facts)
    assert "IPAddress" not in single and "ProtectProc" not in single
    assert not [line for line in single.splitlines() if line.split("=")[0] in IDENTITY]


IDENTITY = (
    "DynamicUser",
    "User",
    "Group",
    "CacheDirectory",
    "WorkingDirectory",
    "Environment",
    "ReadWritePaths",
    "ExecPaths",
)


def test_every_instance_runs_as_a_user_of_its_own_with_the_models_through_the_group() -> None:
    # M14: one uid for every instance let each read the others' /proc/PID/environ (their VLLM_API_KEY).
    unit = render(ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.j2").splitlines()
    identity = [line for line in unit if line.split("=")[0] in IDENTITY + ("SupplementaryGroups",)]
    assert [line for line in identity if not line.startswith("Environment=PATH=")] == [
        "DynamicUser=yes",
        "User=vllm-%i",
        "SupplementaryGroups=vllm",
        "CacheDirectory=vllm/%i",
        "WorkingDirectory=%C/vllm/%i",
        "Environment=HOME=%C/vllm/%i",
        "Environment=TORCHINDUCTOR_CACHE_DIR=%C/vllm/%i/.cache/torchinductor",
        "Environment=TRITON_CACHE_DIR=%C/vllm/%i/.cache/triton",
        # Compiled kernels load from there: systemd 257 mounts a DynamicUser's cache directory noexec otherwise.
        "ExecPaths=%C/vllm/%i",
    ]


def test_instance_memory_limit_is_its_share_of_the_node_unless_overridden() -> None:
    dropin = ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.d" / "gpufleet.conf.j2"
    # 2 instances on a node of 24000 MiB: 0.9 x 24000 / 2 = 10800 MiB each, throttled from 90 % of it.
    two = [INSTANCE, {**INSTANCE, "name": "b", "port": 8001, "gpus": [1]}]
    lines = render(
        dropin, vllm_service_instances=two, vllm_service_instance=FIRST, ansible_facts={"memtotal_mb": 24000}
    ).splitlines()
    assert "MemoryMax=10800M" in lines and "MemoryHigh=9720M" in lines
    override = {**INSTANCE, "unit_overrides": {"MemoryMax": "64G"}}
    lines = render(
        dropin, vllm_service_instances=[override], vllm_service_instance=FIRST, ansible_facts={"memtotal_mb": 24000}
    ).splitlines()
    assert "MemoryMax=64G" in lines and "MemoryHigh=19440M" in lines


SCRIPT = ROLE / "files" / "vllm-nvidia-devices"
# The H200's driver as /proc shows it (a tmpfs over /proc/driver, the fixture over /proc/devices), and an
# empty /dev, in a mount namespace of this test only.
FAKE_DRIVER = """set -e
mount -t tmpfs none /proc/driver
mkdir -p /proc/driver/nvidia/gpus/0000:00:06.0 /proc/driver/nvidia/capabilities/mig
echo "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04" > /proc/driver/nvidia/version
printf 'Model: \\t\\t NVIDIA H200\\nDevice Minor: \\t 0\\n' > /proc/driver/nvidia/gpus/0000:00:06.0/information
printf 'DeviceFileMinor: 1\\nDeviceFileMode: 256\\n' > /proc/driver/nvidia/capabilities/mig/config
printf 'DeviceFileMinor: 2\\nDeviceFileMode: 292\\n' > /proc/driver/nvidia/capabilities/mig/monitor
mount --bind "$1" /proc/devices
mount -t tmpfs none /dev
PATH=/usr/bin:/bin sh "$2" && echo "--- again" && PATH=/usr/bin:/bin sh "$2"
find /dev -type c -exec stat -c '%A %t %T %n' {} +
"""


def test_device_script_makes_the_h200s_nodes_once(tmp_path: Path) -> None:
    proc_devices = tmp_path / "devices"
    proc_devices.write_text(
        "\n".join(line for line in H200.split("\n\n")[0].splitlines() if not line.startswith("#"))
        + "\n\nBlock devices:\n  7 loop\n"
    )
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", FAKE_DRIVER, "sh", str(proc_devices), str(SCRIPT)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 and "unshare failed" in result.stderr:
        pytest.skip(f"no mount namespace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stdout + result.stderr
    first, again = result.stdout.split("--- again\n")
    # The second run changes nothing: no node created, only find's listing follows.
    assert first.count("created ") == 6 and not [line for line in again.splitlines() if line.startswith("created ")]
    made = {
        (int(major, 16), int(minor, 16), path, mode)
        for mode, major, minor, path in (line.split() for line in again.splitlines())
    }
    expected = {
        (n.major, n.minor, n.path, mode)
        for n, mode in zip(
            listed_nodes(H200), ["crw-rw-rw-", "crw-rw-rw-", "crw-rw-rw-", "crw-rw-rw-", "cr--------", "cr--r--r--"]
        )
    }
    assert made == expected


def test_the_workers_of_an_instance_on_ray_get_neither_its_key_nor_the_secret_environment() -> None:
    kept = ROLE / "templates" / "etc" / "vllm-ray" / "ray_non_carry_over_env_vars.json.j2"
    assert json.loads(render(kept)) == ["VLLM_API_KEY"]
    secrets = {"HF_TOKEN": "t", "VLLM_API_KEY": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    assert json.loads(render(kept, vllm_service_secret_environment=secrets)) == [
        "AWS_SECRET_ACCESS_KEY",
        "HF_TOKEN",
        "VLLM_API_KEY",
    ]


def test_cuda_numbers_the_gpus_as_nvml_does() -> None:
    # instance.gpus are NVML's indices; CUDA's default order (fastest first) differs on a node of mixed GPUs.
    env = instance_env({**INSTANCE, "gpus": [1, 3]}, ["localhost"])
    assert (env["CUDA_DEVICE_ORDER"], env["CUDA_VISIBLE_DEVICES"]) == ("PCI_BUS_ID", "1,3")
