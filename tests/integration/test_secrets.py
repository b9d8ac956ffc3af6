"""No secret in any run record, log, report or process list (issue 12, item 3; issue 29: nor a secret exported in
the operator's environment).

The lab has per-instance keys (instance greedy has its own api_key, main uses vllm_service_api_key), a proxy
key, a metrics token and a TLS key per host, all made by the lab. One `gpufleet provision` of the model,
serve and proxy layers (verbose, through ansible-runner, so its job events are kept) and one `gpufleet drift`
of serve and proxy run into a runs directory of this test; then every file under it, the output of both
commands, every node's journal and the command line of every process on the nodes and of every process
the provision started on the controller are searched for every one of those secrets.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_driver_support import sh

from gpufleet import PROJECT_ROOT

pytestmark = pytest.mark.lab

BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")
SECRETS = CACHE / "lab-secrets"
# Every process's command line on a node, one a line (arguments joined by spaces).
CMDLINES = r"for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f 2>/dev/null; echo; done"


def lab_secrets(hosts: list[str]) -> dict[str, str]:
    """Name -> value of every secret the lab makes: each password file, and a line of each host's TLS key."""
    secrets = {path.name: path.read_text().strip() for path in sorted(SECRETS.iterdir()) if path.is_file()}
    for host in hosts:
        pem = (CACHE / "lab-tls" / f"{host}.key").read_text().splitlines()
        secrets[f"TLS key of {host}"] = max(pem[1:-1], key=len)
    return secrets


def descendants(root: int) -> set[int]:
    """Pids of the processes below root on this machine."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def watch_command_lines(process: subprocess.Popen, seen: set[str]) -> None:
    """Collects the command lines of the process's descendants until it ends (ssh, ansible workers)."""
    while process.poll() is None:
        for pid in descendants(process.pid):
            try:
                seen.add(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
        threading.Event().wait(0.2)


# A secret the operator exported in the shell gpufleet runs from (a Hugging Face token, a cloud key): ansible-runner
# used to write the whole environment into every run's record (issue 29, M11).
OPERATOR_SECRETS = {
    "HF_TOKEN": "hf_operator_marker_5f1c0ffee0123456789",
    "AWS_SECRET_ACCESS_KEY": "aws_marker_9a8b7c6d5e",
}


def gpufleet(runs: Path, *arguments: str, seen: set[str]) -> str:
    # ANSIBLE_VERBOSITY=1: what `-v` prints goes into the run's stdout record too.
    env = dict(os.environ, GPUFLEET_RUNS_DIR=str(runs), ANSIBLE_VERBOSITY="1", **OPERATOR_SECRETS)
    process = subprocess.Popen(
        [str(BIN / "gpufleet"), *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=PROJECT_ROOT,
        env=env,
    )
    watcher = threading.Thread(target=watch_command_lines, args=(process, seen), daemon=True)
    watcher.start()
    output, _ = process.communicate(timeout=3000)
    watcher.join()
    print(f"$ gpufleet {' '.join(arguments)} -> exit {process.returncode}\n{output[-3000:]}")
    assert process.returncode in (0, 2), output[-4000:]
    return output


def leaks(places: dict[str, str], secrets: dict[str, str]) -> list[str]:
    return [f"{name} in {place}" for place, text in places.items() for name, value in secrets.items() if value in text]


def test_no_secret_in_run_records_journal_or_process_lists(
    lab_inventory: Path, lab_hosts: dict[str, dict], tmp_path: Path
) -> None:
    hosts = sorted(lab_hosts)
    certs = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "lab" / "builders" / "make_lab_certs.py"),
            "--inventory",
            str(lab_inventory),
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=300,
        check=False,
    )
    assert certs.returncode == 0, certs.stderr
    runs, seen = tmp_path / "runs", set()
    outputs = {
        "provision output": gpufleet(
            runs, "provision", "-i", str(lab_inventory), "--tags", "model,serve,proxy", seen=seen
        ),
        "drift output": gpufleet(
            runs,
            "drift",
            "-i",
            str(lab_inventory),
            "--layers",
            "serve,proxy",
            "--out",
            str(runs / "reports"),
            seen=seen,
        ),
    }
    secrets = lab_secrets(hosts) | {f"the operator's {name}": value for name, value in OPERATOR_SECRETS.items()}
    # The lab really has per-instance keys, and the instances run with them: else there is nothing to find.
    assert secrets["vllm-api-key-greedy"] != secrets["vllm-api-key"]
    for host in hosts:
        rc, text = sh(lab_inventory, host, "grep -c VLLM_API_KEY= /etc/vllm/main.env /etc/vllm/greedy.env")
        assert rc == 0 and text.split() == ["/etc/vllm/main.env:1", "/etc/vllm/greedy.env:1"], text

    records = [path for path in runs.rglob("*") if path.is_file()]
    assert any(path.parent.name == "job_events" for path in records), "the provision left no job events"
    places = {str(path.relative_to(runs)): path.read_text(errors="replace") for path in records}
    places |= outputs
    places["command lines on the controller"] = "\n".join(seen)
    for host in hosts:
        rc, journal = sh(lab_inventory, host, "journalctl --no-pager --output cat")
        assert rc == 0 and journal.count("\n") > 100, journal[-2000:]
        places[f"journal of {host}"] = journal
        rc, cmdlines = sh(lab_inventory, host, CMDLINES)
        assert rc == 0 and "vllm.entrypoints.openai.api_server" in cmdlines, cmdlines[-2000:]
        places[f"command lines on {host}"] = cmdlines
    print(f"searched {len(places)} places ({sum(map(len, places.values())) // 1024} KiB) for {len(secrets)} secrets")
    found = leaks(places, secrets)
    assert not found, f"{len(found)} leaks:\n" + "\n".join(found)
