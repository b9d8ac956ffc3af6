"""Compile caches built once per key and shipped (issue 33), on the lab: vllm@main runs compiled (torch.compile
with Inductor's C++ kernels on the CPU build) instead of eager for this module, from a controller cache directory of
its own.

1. The first start of the key compiles, and the node packs what it built after the warm-up and publishes it on the
   controller (KEY.json, written last, names the archive and its sha256). On a Debian
   13 host this is also the start that failed before the unit allowed code to be loaded from the instance's home
   (systemd 257 mounts a DynamicUser's cache directory noexec).
2. The same node made fresh (its caches and the record of its start gone) gets the shipped cache before its
   instance starts, and the start compiles nothing: Inductor's cache holds exactly the archive's files afterwards;
   drift's serve layer notes the key of the caches the instance uses.
   (vLLM's CPU build logs no cache hit of its own; on a GPU its "Directly load the compiled graph(s)" lines do.)
3. (make test-slow) A tampered archive on the controller is refused: the run warns, the instance starts cold and
   serves, and the node publishes what it built in place of the refused archive; a second run changes nothing;
   hosts of one Debian release share a key, and another release's compilers give another (gcc 12, gcc 14).

vllm@main is put back as the inventory declares it (eager) at the end of the module.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import BIN
from test_driver_support import recap_changed, sh

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.vllm_start import start_phases
from gpufleet import PROJECT_ROOT

HOME = "/var/cache/private/vllm/main"
MARKER = f"{HOME}/.gpufleet-compile-cache.json"
INDUCTOR_FILES = f"cd {HOME}/.cache && find torchinductor -type f | sort"


# One request warms an instance up here: the lab's whole warm-up adds half a minute to each start, and what is
# measured is the start.
PROBE_ONLY = json.dumps({"vllm_service_warmup_requests": [{"name": "probe", "max_tokens": 1}]})


def serve(inventory: Path, limit: str, extra_vars: Path | None) -> str:
    """serve.yml on LIMIT (with EXTRA_VARS); returns its output, failing the test when the run fails."""
    command = [str(BIN / "ansible-playbook"), "-i", str(inventory), "--limit", limit, "playbooks/serve.yml"]
    command += ["-e", PROBE_ONLY] + (["-e", f"@{extra_vars}"] if extra_vars else [])
    result = subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=1800, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    # Ansible's warnings go to stderr.
    return result.stdout + result.stderr


def serve_drift(inventory: Path, host: str, extra_vars: Path) -> str:
    """The serve layer's drift on HOST as declared with EXTRA_VARS; returns the run's output (results as JSON)."""
    command = [str(BIN / "ansible-playbook"), "-i", str(inventory), "--limit", host, "playbooks/drift.yml", "-v"]
    command += ["-e", f"@{extra_vars}", "-e", json.dumps({"drift_layers": ["serve"]})]
    env = dict(os.environ, ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=PROJECT_ROOT, env=env, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    return result.stdout


def make_fresh(inventory: Path, host: str) -> None:
    """The instance's caches, the record of their install and of its last start gone: a node that never ran it."""
    rc, text = sh(
        inventory,
        host,
        f"systemctl stop vllm@main && rm -rf {HOME}/.cache/vllm {HOME}/.cache/torchinductor {MARKER} "
        "/var/lib/gpufleet/vllm/main.started",
    )
    assert rc == 0, text


def journal_of_last_start(inventory: Path, host: str) -> str:
    rc, text = sh(inventory, host, "journalctl -u vllm@main -o cat --no-pager -n 4000")
    assert rc == 0, text
    return text


@pytest.fixture(scope="module")
def compiled(
    lab_inventory: Path, lab_hosts: dict[str, dict], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict]:
    """Extra variables that run vllm@main compiled, with a controller cache directory of the module's own."""
    work = tmp_path_factory.mktemp("compile-cache")
    serve_vars = yaml.safe_load((PROJECT_ROOT / "inventories" / "lab" / "group_vars" / "all" / "serve.yml").read_text())
    main = next(instance for instance in serve_vars["vllm_service_instances"] if instance["name"] == "main")
    extra = {
        # vllm@greedy is left as it runs: not declared in this run, and not pruned.
        "vllm_service_prune": False,
        "vllm_service_compile_cache_controller_dir": str(work / "caches"),
        "vllm_service_instances": [dict(main, enforce_eager=False)],
    }
    extra_vars = work / "compiled.yml"
    extra_vars.write_text(yaml.safe_dump(extra))
    debian13 = [name for name, variables in sorted(lab_hosts.items()) if variables.get("gpufleet_lab_os") == "debian13"]
    host = (debian13 or sorted(lab_hosts))[0]
    yield {"vars": extra_vars, "caches": work / "caches", "host": host}
    serve(lab_inventory, ",".join(sorted(lab_hosts)), None)


def published(caches: Path) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(caches.glob("*.json"))}


def test_the_first_cold_start_of_a_key_publishes_its_caches(lab_inventory: Path, compiled: dict) -> None:
    host = compiled["host"]
    make_fresh(lab_inventory, host)

    serve(lab_inventory, host, compiled["vars"])

    entries = published(compiled["caches"])
    assert len(entries) == 1, entries
    ((key, entry),) = entries.items()
    assert entry["key"] == key and entry["built_on"] == host and entry["instance"] == "main"
    archive = compiled["caches"] / entry["archive"]
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == entry["sha256"]
    assert "torchinductor" in entry["directories"], entry
    assert entry["components"]["options"]["enforce_eager"] is False
    # The start compiled (no cache came with it), and served: it is the one that failed on Debian 13 before.
    phases = start_phases(journal_of_last_start(lab_inventory, host))
    assert phases.to_server_start is not None and phases.seconds.get("engine_init"), phases
    # The node that built the caches holds them: its next start installs nothing.
    rc, marker = sh(lab_inventory, host, f"cat {MARKER}")
    assert rc == 0 and json.loads(marker)["key"] == key, marker


def test_a_fresh_node_starts_from_the_shipped_cache_and_compiles_nothing(lab_inventory: Path, compiled: dict) -> None:
    host = compiled["host"]
    ((key, entry),) = published(compiled["caches"]).items()
    make_fresh(lab_inventory, host)

    output = serve(lab_inventory, host, compiled["vars"])

    assert "Verify the archive and put its caches in the instance's home: vllm@main" in output
    rc, marker = sh(lab_inventory, host, f"cat {MARKER}")
    assert rc == 0, marker
    assert json.loads(marker) == {"key": key, "sha256": entry["sha256"], "directories": entry["directories"]}
    with tarfile.open(compiled["caches"] / entry["archive"]) as tar:
        shipped = sorted(
            name.removeprefix("cache/")
            for name in tar.getnames()
            if name.startswith("cache/torchinductor/") and tar.getmember(name).isfile()
        )
    rc, after = sh(lab_inventory, host, INDUCTOR_FILES)
    assert rc == 0, after
    # Every kernel the start needed was in the shipped cache: Inductor compiled and wrote none of its own.
    assert after.split() == shipped
    phases = start_phases(journal_of_last_start(lab_inventory, host))
    print(f"\ncompile cache {key} on {host}: start from the shipped cache {phases.as_dict()}")
    # Drift knows which caches the instance uses.
    drift = serve_drift(lab_inventory, host, compiled["vars"])
    assert f"vllm@main: compile caches of key {key} (archive sha256 {entry['sha256'][:16]}...)" in drift, drift[-4000:]


@pytest.mark.slow
def test_a_tampered_cache_is_refused_and_the_instance_starts_cold(
    lab_inventory: Path, lab_hosts: dict[str, dict], compiled: dict
) -> None:
    host = compiled["host"]
    ((key, entry),) = published(compiled["caches"]).items()
    archive = compiled["caches"] / entry["archive"]
    archive.write_bytes(archive.read_bytes() + b"tampered")
    make_fresh(lab_inventory, host)

    output = serve(lab_inventory, host, compiled["vars"])

    assert f"compile cache {key} not installed in {HOME}, vLLM starts cold:" in output.replace("\n", " ")
    assert f"not the {entry['sha256']} recorded when it was built" in output.replace("\n", " ")
    rc, health = sh(lab_inventory, host, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health")
    assert health.strip() == "200", health
    # The node chosen for the key published what its cold start built in place of the refused archive.
    rebuilt = published(compiled["caches"])[key]
    assert rebuilt["sha256"] != entry["sha256"], rebuilt
    assert hashlib.sha256((compiled["caches"] / rebuilt["archive"]).read_bytes()).hexdigest() == rebuilt["sha256"]
    rc, marker = sh(lab_inventory, host, f"cat {MARKER}")
    assert rc == 0 and json.loads(marker)["sha256"] == rebuilt["sha256"], marker

    # A second run changes nothing.
    again = serve(lab_inventory, host, compiled["vars"])
    assert recap_changed(again)[host] == 0, again[-4000:]

    # Hosts of one release share a key, whose first host publishes it; another release's compilers give another
    # key (Debian 12's gcc 12, Debian 13's gcc 14).
    for stale in compiled["caches"].iterdir():
        stale.unlink()
    for name in sorted(lab_hosts):
        make_fresh(lab_inventory, name)
    serve(lab_inventory, ",".join(sorted(lab_hosts)), compiled["vars"])
    entries = published(compiled["caches"])
    releases = {variables.get("gpufleet_lab_os") for variables in lab_hosts.values()}
    assert len(entries) == len(releases), entries
    assert len({json.dumps(entry["components"]["compilers"]) for entry in entries.values()}) == len(entries)
