"""Helpers of the drift and rebuild lab tests: the converged fleet, the gpufleet CLI, and the host's files
as a manifest that shows any write. No tests here: test_drift_lab.py and test_rebuild_lab.py import these.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from test_driver_support import publish_standins, sh

from gpufleet import PROJECT_ROOT
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import FleetReport
from gpufleet.drift import read_report

BIN = Path(sys.executable).parent
# The layers the lab converges for these tests (serve and proxy start vLLM and nginx: other tests own them).
LAYERS = "base,driver,gpu_health,toolkit,python,venv,kernels,model"
CONVERGE_PLAYBOOKS = ("base", "driver", "toolkit", "python", "venv", "kernels", "model")
# Everything the layers' roles write, and where a drift run could write if it wrote at all.
TREES = (
    "/etc",
    "/opt",
    "/usr/local",
    "/var/lib/gpufleet",
    "/var/lib/nvidia",
    "/var/cache/gpufleet",
    "/var/log/gpufleet",
    "/var/lib/vllm",
)
# Every entry with type, mode, owner, size, link target and change time (ctime moves on any write or
# chmod, and cannot be set back); every regular file outside the venvs also with its sha256. The venvs'
# 3.5 GB are left to ctime, which a write cannot avoid, to keep the suite fast.
MANIFEST = r"""
set -e
for tree in {trees}; do [ -e "$tree" ] && echo "$tree"; done > /tmp/.gpufleet-trees
xargs -a /tmp/.gpufleet-trees -I{{}} find {{}} -xdev -printf '%y %p %m %U:%G %s %l %C@\n' | sort
xargs -a /tmp/.gpufleet-trees -I{{}} find {{}} -xdev -type f -not -path '/opt/gpufleet/venvs/*' -print0 \
  | sort -z | xargs -0 -r sha256sum
rm -f /tmp/.gpufleet-trees
"""


def fill_mirror(inventory: Path) -> None:
    """The lab mirror's artifacts of every converged layer (each builder is cached and checks its pins)."""
    publish_standins()
    for command in (
        [sys.executable, str(PROJECT_ROOT / "lab" / "builders" / "python_stack.py")],
        [str(BIN / "gpufleet"), "wheelhouse", "build", "-i", str(inventory)],
        [sys.executable, str(PROJECT_ROOT / "lab" / "builders" / "make_tiny_model.py")],
    ):
        result = subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=3600, check=False)
        assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"


# Hosts converged by this pytest session: the drift and rebuild tests leave them converged (the rebuild
# test ends on a clean report), so a second module does not pay for a no-op converge run.
_CONVERGED: set[tuple[str, str]] = set()


def drift_is_clean(inventory: Path, limit: str, layers: str) -> bool:
    """Whether `gpufleet drift` finds the hosts as declared on these layers: then a converge would change nothing
    (drift and provision agree: test_drift_effective.py), and a fixture skips its minutes of no-op run."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-drift-") as runs:
        return gpufleet(Path(runs), "drift", "-i", str(inventory), "--limit", limit, "--layers", layers).returncode == 0


def converge(inventory: Path, limit: str) -> None:
    """Provisions the layers of LAYERS on the hosts in one ansible-playbook run, unless drift finds them converged."""
    if (str(inventory), limit) in _CONVERGED or drift_is_clean(inventory, limit, LAYERS):
        _CONVERGED.add((str(inventory), limit))
        return
    run_playbooks(inventory, limit, CONVERGE_PLAYBOOKS)
    _CONVERGED.add((str(inventory), limit))


def run_playbooks(inventory: Path, limit: str, names: Sequence[str]) -> None:
    """Runs the project's playbooks (playbooks/<name>.yml) on the hosts in one ansible-playbook run."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-converge-") as directory:
        book = Path(directory) / "converge.yml"
        book.write_text(
            "".join(
                f"- name: Converge {name}\n  ansible.builtin.import_playbook: {PROJECT_ROOT / 'playbooks' / name}.yml\n"
                for name in names
            )
        )
        result = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inventory), "--limit", limit, str(book)],
            capture_output=True,
            text=True,
            cwd=PROJECT_ROOT,
            timeout=5400,
            check=False,
            env=dict(os.environ, ANSIBLE_CONFIG=str(PROJECT_ROOT / "ansible.cfg")),
        )
    assert result.returncode == 0, (
        f"running {', '.join(names)} on {limit} failed:\n{result.stdout[-6000:]}{result.stderr[-2000:]}"
    )


def gpufleet(
    runs: Path, *arguments: str, timeout: int = 3600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPUFLEET_RUNS_DIR=str(runs), **(env or {}))
    result = subprocess.run(
        [str(BIN / "gpufleet"), *arguments],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env=env,
        timeout=timeout,
        check=False,
    )
    # Shown with pytest -rP: what the operator would have seen.
    print(f"$ gpufleet {' '.join(arguments)}  -> exit {result.returncode}\n{result.stdout}{result.stderr}")
    return result


def last_report(runs: Path) -> FleetReport:
    latest = sorted(path for path in runs.iterdir() if path.name.endswith("-drift"))[-1]
    return read_report(latest / "drift")


def manifest(inventory: Path, host: str) -> list[str]:
    rc, text = sh(inventory, host, MANIFEST.format(trees=" ".join(TREES)))
    assert rc == 0, text[-2000:]
    return text.splitlines()


def assert_unchanged(before: list[str], after: list[str], host: str) -> None:
    if before != after:
        diff = list(difflib.unified_diff(before, after, f"{host} before", f"{host} after", lineterm="", n=0))
        raise AssertionError(f"{host} changed:\n" + "\n".join(diff[:60]))


def findings(report: FleetReport, host: str, layer: str) -> set[tuple[str, str, str, str]]:
    """(check, field, expected, actual) of a layer's drift, values as text."""
    return {
        (
            item.check,
            item.field,
            json.dumps(item.expected) if not isinstance(item.expected, str) else item.expected,
            json.dumps(item.actual) if not isinstance(item.actual, str) else item.actual,
        )
        for item in report.nodes[host].layers[layer].drift
    }
