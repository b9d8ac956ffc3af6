"""Helpers shared by the driver and toolkit lab tests: stand-in runfiles, playbook runs, host commands.

No tests here: test_driver.py and test_toolkit.py import these.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpufleet import PROJECT_ROOT

BIN = Path(sys.executable).parent
FAIL_MARKER = "/etc/gpufleet-lab/fail-runfile"


@dataclass
class PlayRun:
    """One ansible-playbook run against one host: exit code, output and that host's recap counts."""

    rc: int
    output: str
    recap: dict[str, int]

    @property
    def changed(self) -> int:
        return self.recap.get("changed", -1)

    def describe(self) -> str:
        return f"rc={self.rc} recap={self.recap}\n{self.output[-6000:]}"

    def changed_tasks(self) -> list[str]:
        """The TASK headers of the tasks that reported changed, with their changed lines (for a failure message)."""
        found, task = [], ""
        for line in self.output.splitlines():
            if line.startswith("TASK ["):
                task = line.rstrip("* ")
            elif line.startswith("changed:"):
                found.append(f"{task}: {line[:300]}")
        return found


def recap_changed(output: str) -> dict[str, int]:
    """host -> changed= of an ansible-playbook run's PLAY RECAP."""
    return {
        line.split()[0]: int(line.split("changed=")[1].split()[0])
        for line in output.splitlines()
        if " changed=" in line and ":" in line
    }


def publish_standins() -> dict[str, str]:
    """Builds and publishes the LAB-STANDIN runfiles; returns file name -> sha256."""
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "lab" / "runfiles" / "build.py"), "--publish", "--json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=PROJECT_ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return {item["name"]: item["sha256"] for item in json.loads(result.stdout.split("published in")[0])}


def play(inventory: Path, host: str, playbook: str, *args: str, extra: dict | None = None) -> PlayRun:
    """Runs playbooks/<playbook> limited to host, with extra vars as JSON; never raises on failure."""
    command = [
        str(BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        "--limit",
        host,
        str(PROJECT_ROOT / "playbooks" / playbook),
        *args,
    ]
    if extra:
        command += ["-e", json.dumps(extra)]
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    result = subprocess.run(
        command, capture_output=True, text=True, check=False, cwd=PROJECT_ROOT, env=env, timeout=1500
    )
    output = result.stdout + result.stderr
    recap: dict[str, int] = {}
    match = re.search(rf"^{re.escape(host)}\s+:\s+(.*)$", output, re.MULTILINE)
    if match:
        recap = {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}
    run = PlayRun(result.returncode, output, recap)
    # Shown with pytest -rP: the changed count of every run, for the record.
    print(f"ansible-playbook {playbook} {' '.join(args)} {json.dumps(extra or {})} -> rc={run.rc} {run.recap}")
    return run


def sh(inventory: Path, host: str, script: str) -> tuple[int, str]:
    """Runs a shell script on the host through ansible; returns (rc, stdout + stderr) of the script."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-sh-") as tree:
        command = [
            str(BIN / "ansible"),
            "-i",
            str(inventory),
            host,
            "-m",
            "ansible.builtin.shell",
            "-a",
            script,
            "--tree",
            tree,
        ]
        subprocess.run(command, capture_output=True, text=True, check=False, cwd=PROJECT_ROOT, timeout=600)
        result = json.loads((Path(tree) / host).read_text())
    assert "rc" in result, f"ansible could not run the command on {host}: {result}"
    return result["rc"], result.get("stdout", "") + result.get("stderr", "")


def boot_id(inventory: Path, host: str) -> str:
    rc, text = sh(inventory, host, "cat /proc/sys/kernel/random/boot_id")
    assert rc == 0, text
    return text.strip()


def runfile_test_inventory(lab_inventory: Path) -> Path:
    """The lab inventory (GPUFLEET_RUNFILE_TEST_INVENTORY may point at another lab's, with the same group_vars)."""
    return Path(os.environ.get("GPUFLEET_RUNFILE_TEST_INVENTORY") or lab_inventory)


def runfile_test_host(
    inventory: Path, lab_hosts: dict[str, dict], clean: str, restore: str | None = None
) -> Iterator[str]:
    """The last lab host (or GPUFLEET_RUNFILE_TEST_HOST), cleaned by the script `clean` before and after the
    scenario; the stand-ins published first. `restore` (a playbook) then gives the host back as the lab
    declares it: later tests serve on it, and vLLM's GPU health gate needs the driver the stack declares."""
    name = os.environ.get("GPUFLEET_RUNFILE_TEST_HOST") or sorted(lab_hosts)[-1]
    publish_standins()
    rc, text = sh(inventory, name, clean)
    assert rc == 0, text
    yield name
    sh(inventory, name, clean)
    if restore:
        run = play(inventory, name, restore)
        assert run.rc == 0, f"restoring {name} with {restore}: {run.describe()}"
