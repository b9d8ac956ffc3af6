"""Rack caches on the lab (issue 37): nodes pull the model through their rack's cache (role rack_cache, converged by
playbooks/base.yml's play for the group rack_caches), so it leaves the mirror once per rack; a cache that serves a
file of another sha256 is refused and a cache that is down is passed over, each said, the node pulling from the
mirror instead.

The two lab hosts make two racks, each its own cache (a peer of the rack), then one rack whose second node reads
from the first's cache over the lab's cluster link. The mirror counts the bytes it sends per file
(gpufleet.lab.mirror_server), which is what is measured. In the default controller mode, the controller's copy is
hashed by the run's first host only, and a node that holds the pinned file gets no copy (nothing hashed for it on
the controller).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet import PROJECT_ROOT
from gpufleet.lab import mirror
from test_driver_support import recap_changed

BIN = PROJECT_ROOT / ".venv" / "bin"
PORT = 8781
NODE_CACHE = "/var/cache/gpufleet/artifacts"
CACHE_FILES = "/var/cache/gpufleet/rack-cache/files"
REFUSED = "was not used"

# Converge the caches, fetch the lab's model on every node, remove the caches (lab/plays/README.md).
PLAYS = PROJECT_ROOT / "lab" / "plays"
CONVERGE, PULL, REMOVE = (
    PLAYS / name for name in ("rack_cache_converge.yml", "artifact_pull.yml", "rack_cache_remove.yml")
)


def racks(directory: Path, name: str, urls: dict[str, str]) -> Path:
    """An inventory source beside the lab's: both hosts caches, each with its rack's cache URL."""
    hosts = {host: {"gpufleet_rack_cache_url": url} for host, url in urls.items()}
    path = directory / f"{name}.yml"
    document = {"all": {"children": {"rack_caches": {"hosts": {host: None for host in urls}}, name: {"hosts": hosts}}}}
    path.write_text(yaml.safe_dump(document))
    return path


def playbook(lab_inventory: Path, extra: Path, path: Path | str, *args: str) -> str:
    """ansible-playbook against the lab inventory and `extra`; its output, asserting success."""
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(lab_inventory), "-i", str(extra), str(path), *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result.stdout


@pytest.fixture(scope="module")
def model(lab_inventory: Path) -> dict[str, Any]:
    declared = yaml.safe_load((lab_inventory.parent / "group_vars" / "all" / "model.yml").read_text())
    first = declared["model_store_models"][0]
    path = "/" + first["url"].split("}}/", 1)[1]
    return {"path": path, "sha256": first["sha256"], "size": (mirror.mirror_dir() / path.lstrip("/")).stat().st_size}


@pytest.fixture(scope="module")
def two_racks(
    lab_inventory: Path, lab_hosts: dict[str, dict], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """Both lab hosts cache for their own rack (converged through playbooks/base.yml), with empty caches; removed
    after, through the role's remove entry point."""
    directory = tmp_path_factory.mktemp("racks")
    inventory = racks(directory, "rack_own", {host: f"http://127.0.0.1:{PORT}" for host in lab_hosts})
    playbook(lab_inventory, inventory, PROJECT_ROOT / "playbooks" / "base.yml")
    try:
        run(
            lab_inventory,
            "all",
            f"systemctl stop gpufleet-rack-cache && rm -rf {CACHE_FILES}/* && systemctl start gpufleet-rack-cache",
        )
        yield inventory
    finally:
        playbook(lab_inventory, inventory, REMOVE)


def run(lab_inventory: Path, pattern: str, command: str) -> str:
    """A shell command as root on the hosts of the pattern; ansible's output, asserting success."""
    result = subprocess.run(
        [str(BIN / "ansible"), "-i", str(lab_inventory), pattern, "-b", "-m", "ansible.builtin.shell", "-a", command],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return result.stdout


def main_pid(lab_inventory: Path, host: str) -> int:
    """The rack cache's main process on the host: a new one after each restart."""
    return int(
        run(lab_inventory, host, "systemctl show --property MainPID --value gpufleet-rack-cache").splitlines()[-1]
    )


def pull(lab_inventory: Path, inventory: Path, model: dict[str, Any]) -> tuple[int, str]:
    """Each node's copy of the model dropped from its artifact cache and pulled again: the bytes the mirror sent
    for the model meanwhile, and the run's output."""
    run(lab_inventory, "gpu_nodes", f"rm -rf {NODE_CACHE}/{model['sha256']}")
    before = mirror.served_bytes().get(model["path"], 0)
    output = playbook(lab_inventory, inventory, PULL)
    run(
        lab_inventory,
        "gpu_nodes",
        f"cd {NODE_CACHE}/{model['sha256']} && sha256sum *.tar.gz | grep -q '^{model['sha256']} '",
    )
    return mirror.served_bytes().get(model["path"], 0) - before, output


def test_each_rack_costs_the_mirror_one_copy_and_a_bad_cache_is_passed_over(
    lab_inventory: Path, lab_hosts: dict[str, dict], two_racks: Path, model: dict[str, Any]
) -> None:
    first, second = sorted(lab_hosts)

    # Two racks, two empty caches: one copy each from the mirror.
    sent, output = pull(lab_inventory, two_racks, model)
    assert sent == 2 * model["size"], output[-3000:]
    assert REFUSED not in output

    # One rack: the second node reads the first's cache over the cluster link; both are cache hits.
    cluster = lab_hosts[first]["gpufleet_lab_cluster_address"]
    one_rack = racks(
        two_racks.parent, "rack_one", {first: f"http://127.0.0.1:{PORT}", second: f"http://{cluster}:{PORT}"}
    )
    sent, output = pull(lab_inventory, one_rack, model)
    assert sent == 0, output[-3000:]
    assert REFUSED not in output

    # The first cache serves a file of another sha256 (its last bytes overwritten); the second is down. Each node
    # says why its cache was not used and pulls the model from the mirror; each ends with the pinned file.
    poison = (
        f"f=$(grep -rlF 'KEY: {model['path']}?sha256={model['sha256']}' {CACHE_FILES}) && test -n \"$f\" && "
        'printf poisoned | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 8 )) conv=notrunc status=none'
    )
    run(lab_inventory, first, poison)
    run(lab_inventory, second, "systemctl stop gpufleet-rack-cache")
    sent, output = pull(lab_inventory, two_racks, model)
    assert sent == 2 * model["size"], output[-3000:]
    lines = " ".join(output.split())
    assert f"the rack cache http://127.0.0.1:{PORT} {REFUSED}: The checksum for" in lines, output[-3000:]
    assert "did not match" in lines and model["sha256"] in lines
    assert "Connection refused" in lines


def test_a_configuration_a_killed_run_left_unloaded_is_loaded_by_the_next_run(
    lab_inventory: Path, lab_hosts: dict[str, dict], two_racks: Path
) -> None:
    first = sorted(lab_hosts)[0]
    before = main_pid(lab_inventory, first)
    # A run for rack_cache_inactive 29d killed after writing the configuration, before the restart: the live file is
    # the new one, the service still runs the old one.
    run(lab_inventory, first, "sed -i 's/30d/29d/g' /etc/gpufleet/rack-cache/nginx.conf")
    output = playbook(lab_inventory, two_racks, CONVERGE, "--limit", first, "-e", "rack_cache_inactive=29d")
    restarted = main_pid(lab_inventory, first)
    assert restarted != before, output[-3000:]
    # Loaded and recorded: the next run has nothing to restart.
    output = playbook(lab_inventory, two_racks, CONVERGE, "--limit", first, "-e", "rack_cache_inactive=29d")
    assert main_pid(lab_inventory, first) == restarted, output[-3000:]
    assert "changed=0" in output, output[-3000:]


def task_results(output: str, task: str) -> dict[str, str]:
    """host -> what a task reported for it (ok, changed, skipping, ...), from a run's default output."""
    results: dict[str, str] = {}
    within = False
    for line in output.splitlines():
        if line.startswith("TASK ["):
            within = task in line
        elif within and (found := re.match(r"^(ok|changed|skipping|fatal): \[([^\]]+)\]", line)):
            results[found.group(2)] = found.group(1)
    return results


def test_the_controller_hashes_its_copy_once_per_run(
    lab_inventory: Path, lab_hosts: dict[str, dict], two_racks: Path, model: dict[str, Any]
) -> None:
    pinned = f"cd {NODE_CACHE}/{model['sha256']} && sha256sum *.tar.gz | grep -q '^{model['sha256']} '"
    nodes = sorted(lab_hosts)
    for _run in range(2):
        run(lab_inventory, "gpu_nodes", f"rm -rf {NODE_CACHE}/{model['sha256']}")
        output = playbook(lab_inventory, two_racks, PULL, "-e", "lab_artifact_fetch=controller", "-v")
        hashed = re.findall(r'"?hashed"?: (true|false)', output)
        assert sorted(hashed) == ["false"] * (len(lab_hosts) - 1) + ["true"], output[-3000:]
        assert task_results(output, "Copy to the node") == dict.fromkeys(nodes, "changed"), output[-3000:]
        run(lab_inventory, "gpu_nodes", pinned)
    # Nodes that hold the pinned file get no copy: the controller checksums nothing for them (copy would hash its
    # source once per host), and the node hashes its file once.
    output = playbook(lab_inventory, two_racks, PULL, "-e", "lab_artifact_fetch=controller", "-v")
    assert task_results(output, "Copy to the node") == dict.fromkeys(nodes, "skipping"), output[-3000:]
    assert task_results(output, "Hash on the node") == dict.fromkeys(nodes, "skipping"), output[-3000:]
    assert recap_changed(output) == dict.fromkeys(nodes, 0), output[-3000:]
    # A node whose file was changed gets the copy again; the other is left alone.
    run(
        lab_inventory, nodes[0], f"for file in {NODE_CACHE}/{model['sha256']}/*.tar.gz; do echo tampered >> $file; done"
    )
    output = playbook(lab_inventory, two_racks, PULL, "-e", "lab_artifact_fetch=controller", "-v")
    copied = {node: "changed" if node == nodes[0] else "skipping" for node in nodes}
    assert task_results(output, "Copy to the node") == copied, output[-3000:]
    run(lab_inventory, "gpu_nodes", pinned)
