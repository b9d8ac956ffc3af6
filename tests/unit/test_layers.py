"""The layer registry (playbooks/vars/layers.yml) is the one list of layers: site.yml's imports follow it (Ansible
needs static imports, so this test is what keeps them in step), and the CLI's lists are read from it."""

from __future__ import annotations

import yaml

from gpufleet import PROJECT_ROOT, drift, drift_rebuild, layers

PLAYBOOKS = PROJECT_ROOT / "playbooks"


def site_imports() -> list[dict]:
    return yaml.safe_load((PLAYBOOKS / "site.yml").read_text())


def test_site_imports_every_layer_with_a_playbook_in_registry_order_tagged_with_its_name() -> None:
    imported = [
        (entry["ansible.builtin.import_playbook"], entry.get("tags"))
        for entry in site_imports()
        if entry["ansible.builtin.import_playbook"] not in ("preflight.yml", "lease.yml", "verify.yml", "resume.yml")
    ]
    expected = [(layer.playbook, [layer.name]) for layer in layers.registry() if layer.playbook]
    assert imported == expected


def test_each_layer_import_runs_only_when_a_rebuild_selects_it() -> None:
    for entry in site_imports():
        name = entry["ansible.builtin.import_playbook"].removesuffix(".yml")
        if name in layers.rebuildable():
            assert entry["when"] == f"rebuild_layers is not defined or '{name}' in rebuild_layers"


def test_preflight_comes_first_untagged_and_its_tasks_always_run() -> None:
    first = site_imports()[0]
    assert first["ansible.builtin.import_playbook"] == "preflight.yml" and "tags" not in first and "when" not in first
    # The stack's validation, the role variables' check (role_values), the capacity check (vllm_service's entry
    # point capacity: every task of the role file it includes gets the tag too), then reaching each host for its
    # release and the release check (playbooks/vars/platforms.yml): every task of each always runs. The last two
    # alone contact the hosts, and are tagged `connects` besides, which `gpufleet plan` skips.
    plays = yaml.safe_load((PLAYBOOKS / "preflight.yml").read_text())
    assert len(plays) == 5
    for play in plays[:3]:
        assert [task["tags"] for task in play["tasks"]] == [["always"]] * len(play["tasks"])
    for play in plays[3:]:
        assert [task["tags"] for task in play["tasks"]] == [["always", "connects"]] * len(play["tasks"])
    (capacity,) = plays[2]["tasks"]
    include = capacity["ansible.builtin.include_role"]
    assert include["tasks_from"] == "capacity.yml" and include["apply"]["tags"] == ["always"]


def test_verify_follows_the_layers_that_can_break_a_link() -> None:
    names = [entry["ansible.builtin.import_playbook"] for entry in site_imports()]
    assert names.index("verify.yml") == names.index("kernels.yml") + 1
    verify = next(entry for entry in site_imports() if entry["ansible.builtin.import_playbook"] == "verify.yml")
    assert sorted(verify["tags"]) == ["driver", "kernels", "toolkit", "venv"]


def test_the_cli_reads_the_registry() -> None:
    assert (
        drift.LAYERS
        == layers.names()
        == (
            "base",
            "driver",
            "gpu_health",
            "toolkit",
            "python",
            "venv",
            "kernels",
            "model",
            "ray_cluster",
            "serve",
            "proxy",
        )
    )
    assert drift_rebuild.REBUILDABLE == tuple(name for name in layers.names() if name != "gpu_health")
    assert drift_rebuild.PROVIDED_BY == {"gpu_health": "driver"}
    assert drift_rebuild.DEPENDENTS["python"] == ("venv",)


def test_rebuild_runs_the_layers_through_site() -> None:
    plays = yaml.safe_load((PLAYBOOKS / "rebuild.yml").read_text())
    assert plays[-1]["ansible.builtin.import_playbook"] == "site.yml"
    layer_playbooks = {layer.playbook for layer in layers.registry() if layer.playbook}
    assert not any(entry.get("ansible.builtin.import_playbook") in layer_playbooks for entry in plays)


def test_rebuild_asks_the_roles_to_reset_themselves() -> None:
    # The clearing play holds no role internals: each step is a role's `reset` entry point (or the record of
    # what vllm_service's stopped, which resume.yml reads).
    plays = yaml.safe_load((PLAYBOOKS / "rebuild.yml").read_text())
    clearing = next(play for play in plays if "tasks" in play and play["name"].startswith("Rebuild — stop"))
    resets = []
    for task in clearing["tasks"]:
        if "ansible.builtin.set_fact" in task:
            assert set(task["ansible.builtin.set_fact"]) == {"rebuild_stopped_instances"}
            continue
        include = task["ansible.builtin.include_role"]
        assert include["tasks_from"] == "reset.yml" and "when" in task, task["name"]
        assert (PROJECT_ROOT / "roles" / include["name"] / "tasks" / "reset.yml").is_file()
        resets.append(include["name"])
    assert resets == ["vllm_service", "inference_venv", "model_store", "nvidia_driver", "cuda_toolkit"]
