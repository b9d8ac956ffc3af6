"""Shared helpers for tests against the running lab fleet (`gpufleet lab up`, run by scripts/run-tests.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT

# The same variable `gpufleet lab` reads: the suite can run against a lab of its own (with
# GPUFLEET_LAB_DIR and GPUFLEET_LAB_PREFIX set alike) while the shared one is busy.
LAB_INVENTORY = Path(os.environ.get("GPUFLEET_LAB_INVENTORY") or PROJECT_ROOT / "inventories" / "lab" / "hosts.yml")
BIN = Path(sys.executable).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything here needs the lab fleet.
    for item in items:
        item.add_marker(pytest.mark.lab)


# What a failed test's report adds from every lab host: the failed units and their journals of this boot. CI keeps
# only the output's tail, and the lab is gone when the run ends; a unit that failed earlier (a stop that timed out,
# a crash loop) shows here with its cause.
FAILED_UNITS_SCRIPT = (
    "systemctl is-system-running; systemctl --failed --no-legend --plain; "
    "for unit in $(systemctl --failed --no-legend --plain | cut -d' ' -f1); do "
    'echo "--- journal of $unit"; journalctl -b -u "$unit" -n 40 --no-pager -o short-monotonic; done'
)


def failed_units_report(inventory: Path) -> str:
    command = [str(BIN / "ansible"), "-i", str(inventory), "gpu_nodes", "-m", "ansible.builtin.shell"]
    command += ["-a", FAILED_UNITS_SCRIPT]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT, check=False)
    except subprocess.TimeoutExpired:
        return "the lab hosts did not answer within 120 s"
    return result.stdout[-6000:] + result.stderr[-1000:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if report.when == "call" and report.failed and LAB_INVENTORY.is_file():
        report.sections.append(("lab hosts: failed units", failed_units_report(LAB_INVENTORY)))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # What the passed lab tests printed (their figures: times, memory, counts), which -q would otherwise drop:
    # CI's output is the only record of a run on its machine.
    printed = [(report.nodeid, report.capstdout.strip()) for report in terminalreporter.stats.get("passed", [])]
    printed = [(nodeid, text) for nodeid, text in printed if text]
    if printed:
        terminalreporter.section("figures printed by the passed lab tests")
        for nodeid, text in printed:
            terminalreporter.write_line(f"{nodeid}:")
            for line in text.splitlines()[-10:]:
                terminalreporter.write_line(f"  {line[:400]}")


@pytest.fixture(scope="session")
def lab_inventory() -> Path:
    """The shared lab's inventory; fails (not skips) when no lab runs, so a missing lab is visible."""
    if not LAB_INVENTORY.is_file():
        pytest.fail(f"{LAB_INVENTORY} is missing: run `gpufleet lab up` before the integration tests")
    return LAB_INVENTORY


@pytest.fixture(scope="session")
def lab_hosts(lab_inventory: Path) -> dict[str, dict]:
    """Host name -> host variables of group gpu_nodes."""
    document = yaml.safe_load(lab_inventory.read_text())
    return document["all"]["children"]["gpu_nodes"]["hosts"]


AnsibleRunner = Callable[..., dict[str, dict]]


def run_ansible(inventory: Path, pattern: str, module: str, args: str = "", timeout: int = 600) -> dict[str, dict]:
    """Runs one ad-hoc module; returns host -> module result. Fails when ansible or any host fails."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-ansible-") as tree:
        # --tree writes each host's result as JSON: parsed, not scraped from the screen output.
        command = [str(BIN / "ansible"), "-i", str(inventory), pattern, "-m", module, "--tree", tree]
        if args:
            command += ["-a", args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=PROJECT_ROOT, check=False)
        results = {path.name: json.loads(path.read_text()) for path in Path(tree).iterdir()}
    failed = {host: r for host, r in results.items() if r.get("failed") or r.get("unreachable")}
    assert result.returncode == 0 and not failed, (
        f"ansible {pattern} -m {module} failed (rc {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}"
    )
    return results


@pytest.fixture(scope="session")
def ansible(lab_inventory: Path) -> AnsibleRunner:
    """`ansible(pattern, module, args)` against the shared lab inventory."""
    return lambda pattern, module, args="", timeout=600: run_ansible(lab_inventory, pattern, module, args, timeout)


@pytest.fixture()
def host_vars(lab_inventory: Path, lab_hosts: dict[str, dict]) -> Iterator[Path]:
    """A host_vars directory beside the lab inventory for a test's declaration change; its files go after."""
    directory = lab_inventory.parent / "host_vars"
    created = not directory.exists()
    directory.mkdir(exist_ok=True)
    # Only this lab's hosts' files: the directory is beside every lab's inventory, private labs' included.
    ours = {directory / f"{host}.yml" for host in lab_hosts}
    before = {path for path in ours if path.exists()}
    yield directory
    for path in ours - before:
        path.unlink(missing_ok=True)
    if created and not any(directory.iterdir()):
        directory.rmdir()
