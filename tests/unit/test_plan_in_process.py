"""`gpufleet plan -i` in one process (issue 37): the same answers as playbooks/preflight.yml run by ansible-playbook,
host by host, and each distinct declaration checked once.

The inventory mixes what makes templating per host: a mirror URL built from inventory_hostname through another
variable, one looked up with lookup('vars'), a host_vars file, a role variable that contradicts the stack on one
host and a value its rules refuse on another.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet import PROJECT_ROOT, fleet_plan
from gpufleet.ansible_options import settings_environment
from gpufleet.collection import collections_dir
from gpufleet.runner import run_playbook

EXAMPLE = PROJECT_ROOT / "inventories" / "example"
VAULT_PASSWORD = EXAMPLE / "example-vault-password"
PASSING = "h100-01.infer.example.internal,h100-02.infer.example.internal,h200-01.infer.example.internal"
CONFLICT = "h200-02.infer.example.internal"
REFUSED_VALUE = "h100-03.infer.example.internal"


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plan-in-process")
    copy = root / "example"
    shutil.copytree(EXAMPLE, copy)
    shutil.copytree(PROJECT_ROOT / "inventories" / "example-models", root / "example-models")
    with (copy / "group_vars" / "h100.yml").open("a") as h100:
        h100.write(
            "\nrack_of_host: \"{{ inventory_hostname.split('.')[0] }}\"\n"
            'gpufleet_mirror_url: "https://{{ rack_of_host }}.mirror.example.internal/gpufleet"\n'
        )
    with (copy / "group_vars" / "h200.yml").open("a") as h200:
        h200.write(
            "\ngpufleet_mirror_url: \"https://{{ lookup('ansible.builtin.vars', 'inventory_hostname') }}.m.example"
            '.internal/g"\n'
        )
    (copy / "host_vars").mkdir()
    (copy / "host_vars" / f"{CONFLICT}.yml").write_text("nvidia_driver_version: 570.124.06\n")
    (copy / "host_vars" / f"{REFUSED_VALUE}.yml").write_text('inference_proxy_server_name: "two\\nlines"\n')
    return copy


@pytest.fixture(autouse=True)
def vault_password(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(VAULT_PASSWORD))
    monkeypatch.setenv("GPUFLEET_RUNS_DIR", str(tmp_path / "runs"))


def preflight(inventory: Path, limit: str) -> dict[str, dict[str, Any]]:
    """Each host's results of the preflight tasks plan answers for, from a real ansible-playbook run."""
    found: dict[str, dict[str, Any]] = {}

    def keep(event: dict[str, Any]) -> bool:
        data = event.get("event_data") or {}
        if event.get("event") in ("runner_on_ok", "runner_on_failed"):
            found.setdefault(data["host"], {})[str(data["task"])] = (event["event"], data.get("res") or {})
        return True

    run_playbook(
        "preflight.yml", inventory, limit=limit, skip_tags="connects", check=True, quiet=True, event_handler=keep
    )
    return found


def test_the_plan_answers_as_preflight_does_for_every_host(inventory: Path) -> None:
    ran = preflight(inventory, PASSING)
    plans = {plan.host: plan for plan in fleet_plan.plan_inventory(inventory, PASSING)}
    assert sorted(plans) == sorted(ran) == sorted(PASSING.split(","))
    for host, plan in plans.items():
        tasks = ran[host]
        kind, validated = tasks[
            "Validate gpufleet_stack (every link of GPU -> driver -> CUDA -> torch -> vLLM -> flash-attn -> Python)"
        ]
        assert kind == "runner_on_ok" and plan.ok
        assert plan.message == validated["msg"]
        assert plan.result["artifacts"] == validated["artifacts"] and plan.result["chain"] == validated["chain"]
        (capacity,) = [res for task, (_, res) in tasks.items() if task.startswith("Predict each instance")]
        assert plan.capacity == capacity["capacity"]
        assert (
            plan.models
            == tasks["Name the model tarballs each host stages"][1]["ansible_facts"]["gpufleet_preflight_models"]
        )
    # Each host's own mirror, through a variable naming inventory_hostname and through a lookup.
    urls = {host: plan.models["mirror_url"] for host, plan in plans.items()}
    assert urls == {
        "h100-01.infer.example.internal": "https://h100-01.mirror.example.internal/gpufleet",
        "h100-02.infer.example.internal": "https://h100-02.mirror.example.internal/gpufleet",
        "h200-01.infer.example.internal": "https://h200-01.infer.example.internal.m.example.internal/g",
    }
    assert (
        plans["h100-02.infer.example.internal"]
        .result["artifacts"][0]["url"]
        .startswith(urls["h100-02.infer.example.internal"])
    )


@pytest.mark.parametrize(
    ("host", "task"),
    [
        (
            CONFLICT,
            "Validate gpufleet_stack (every link of GPU -> driver -> CUDA -> torch -> vLLM -> flash-attn -> Python)",
        ),
        (REFUSED_VALUE, "Check every role's variables for this host"),
    ],
)
def test_a_host_preflight_refuses_is_refused_by_the_plan_with_the_same_words(
    inventory: Path, host: str, task: str
) -> None:
    kind, refused = preflight(inventory, host)[host][task]
    assert kind == "runner_on_failed"
    (plan,) = fleet_plan.plan_inventory(inventory, host)
    assert not plan.ok and plan.message == refused["msg"]
    assert not fleet_plan.document(inventory, [plan])["compatible"]


WORKER_COUNTING = """
import json, sys
from gpufleet import collection, plan_worker
plan_worker.load_collections()
checks = collection.plugin_util("preflight_checks")
calls = {"stack_result": 0, "capacity_checks": 0, "role_problems": 0}
def counted(name):
    original = getattr(checks, name)
    def call(*args, **kwargs):
        calls[name] += 1
        return original(*args, **kwargs)
    setattr(checks, name, call)
for name in calls:
    counted(name)
document = plan_worker.plan_hosts(json.load(sys.stdin))
print(json.dumps({"calls": calls, "hosts": len(document["hosts"]), "ok": sum(host["ok"] for host in document["hosts"])}))
"""


def test_each_distinct_declaration_is_checked_once_however_many_hosts_share_it(tmp_path: Path) -> None:
    sys.path.insert(0, str(PROJECT_ROOT / "bench"))
    try:
        from scale_plan import generated_inventory
    finally:
        sys.path.remove(str(PROJECT_ROOT / "bench"))
    inventory = generated_inventory(tmp_path, 300)
    environment = dict(os.environ)
    request = {
        "inventory": str(inventory),
        "limit": "",
        "var_files": [],
        "vault_password_files": [str(VAULT_PASSWORD)],
        "vault_password": "",
    }
    result = subprocess.run(
        [sys.executable, "-c", WORKER_COUNTING],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env={**environment, **settings_environment(environment, PROJECT_ROOT, collections_dir())},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts["hosts"] == counts["ok"] == 300
    # Two GPU classes: two stacks, two capacity declarations. The role values: each option once per distinct value,
    # and per host only the example's values built from inventory_hostname (the proxy's certificate, key, server
    # name and the mp leader filter's) -- far fewer than one check per role and host (300 x 11).
    assert counts["calls"]["stack_result"] == 2 and counts["calls"]["capacity_checks"] == 2
    assert counts["calls"]["role_problems"] < 300 * 5
