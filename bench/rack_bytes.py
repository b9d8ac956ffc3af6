"""The bytes the mirror sends for a model staged on every lab host through rack caches (issue 37): each rack's first
host its cache (role rack_cache, emptied first), every host pulling the lab's model through its rack's cache at once
(artifact_fetch: node). Prints the racks and the mirror's bytes for the model's file, and how many copies of it that
is; one copy per rack is the aim.

Usage: .venv/bin/python bench/rack_bytes.py

Needs a lab with its mirror filled (`gpufleet lab up --hosts 4`, then
`ansible-playbook -i inventories/lab/hosts.yml playbooks/lab_mirror.yml`). Lab hosts reach one another only over the
cluster link of hosts 1 and 2, so those two make one rack (the second reading the first's cache over the link) and
every other host is a rack of its own. The mirror counts the bytes it sends per file (gpufleet.lab.mirror_server);
the caches are removed at the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LAB = PROJECT_ROOT / "inventories" / "lab" / "hosts.yml"
BIN = PROJECT_ROOT / ".venv" / "bin"
PORT = 8781
NODE_CACHE = "/var/cache/gpufleet/artifacts"
CACHE_FILES = "/var/cache/gpufleet/rack-cache/files"

# Converge the caches, fetch the lab's model on every node, remove the caches (lab/plays/README.md).
PLAYS = PROJECT_ROOT / "lab" / "plays"


def racks_inventory(hosts: dict[str, dict], path: Path) -> list[list[str]]:
    """The hosts on the cluster link in one rack, cached by the first of them; every other host a rack of its own.
    Written as an inventory source beside the lab's."""
    linked = sorted(name for name, host in hosts.items() if host.get("gpufleet_lab_cluster_address"))
    racks = ([linked] if linked else []) + [[name] for name in sorted(hosts) if name not in linked]
    urls = {}
    for rack in racks:
        address = hosts[rack[0]].get("gpufleet_lab_cluster_address", "")
        for host in rack:
            urls[host] = f"http://{address if host != rack[0] else '127.0.0.1'}:{PORT}"
    document = {
        "all": {
            "children": {
                "rack_caches": {"hosts": {rack[0]: None for rack in racks}},
                "racked": {"hosts": {host: {"gpufleet_rack_cache_url": url} for host, url in urls.items()}},
            }
        }
    }
    path.write_text(yaml.safe_dump(document))
    return racks


def ansible(args: list[str]) -> str:
    result = subprocess.run(args, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=1800, check=False)
    if result.returncode != 0:
        sys.exit(f"{' '.join(args[:4])} ... failed:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    return result.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    sys.path.insert(0, str(PROJECT_ROOT))
    from gpufleet.lab import mirror

    hosts = yaml.safe_load(LAB.read_text())["all"]["children"]["gpu_nodes"]["hosts"]
    declared = yaml.safe_load((LAB.parent / "group_vars" / "all" / "model.yml").read_text())["model_store_models"][0]
    model_path = "/" + declared["url"].split("}}/", 1)[1]
    size = (mirror.mirror_dir() / model_path.lstrip("/")).stat().st_size
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        racks = racks_inventory(hosts, root / "racks.yml")
        playbook = [str(BIN / "ansible-playbook"), "-i", str(LAB), "-i", str(root / "racks.yml")]
        shell = [str(BIN / "ansible"), "-i", str(LAB), "-b", "-m", "ansible.builtin.shell", "-a"]
        ansible([*playbook, str(PLAYS / "rack_cache_converge.yml")])
        try:
            caches = ",".join(rack[0] for rack in racks)
            ansible(
                [
                    *shell,
                    f"systemctl stop gpufleet-rack-cache && rm -rf {CACHE_FILES}/* && systemctl start gpufleet-rack-cache",
                    caches,
                ]
            )
            ansible([*shell, f"rm -rf {NODE_CACHE}/{declared['sha256']}", "gpu_nodes"])
            before = mirror.served_bytes().get(model_path, 0)
            output = ansible([*playbook, str(PLAYS / "artifact_pull.yml")])
            sent = mirror.served_bytes().get(model_path, 0) - before
        finally:
            ansible([*playbook, str(PLAYS / "rack_cache_remove.yml")])
    print(f"model file {model_path}: {size:,} bytes; {len(hosts)} hosts in {len(racks)} racks:")
    for rack in racks:
        print(f"  rack of {', '.join(rack)}: cache on {rack[0]}")
    for line in output.splitlines():
        if "was not used" in line or "pulling from" in line:
            print("  " + line.strip()[:300])
    print(f"mirror sent {sent:,} bytes = {sent / size:.2f} copies ({sent / size / len(racks):.2f} per rack)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
