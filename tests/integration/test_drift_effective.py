"""Drift compares the effective state, and agrees with provisioning (issue 12, items 5 and 6), on one lab node:

- an operator's drop-in in the template-wide directory vllm@.service.d/ (daemon-reloaded) changes every
  instance: the serve layer reports it for each;
- an instance enabled for this boot only (`enable --runtime`, which ansible's systemd_service enables again):
  reported as not enabled, as systemctl is-enabled resolves it;
- a file of the venv edited in place, the package versions unchanged: found against pip's RECORD;
- a kernel in /boot that DKMS has not built the driver's module for: reported by the driver layer.

Then `gpufleet provision` of the venv and serve layers: every task it changed must be in a layer the drift
run reported as drifted (drift said clean and provision changed something = a blind spot). Everything is
undone at the end, whatever failed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_drift_support import PROJECT_ROOT, findings, gpufleet, last_report
from test_driver_support import sh

from gpufleet import layers

pytestmark = pytest.mark.lab

SITE = "/opt/gpufleet/venvs/current/lib/python3*/site-packages"
KERNEL = "6.1.0-999-gpufleet-test"
TAMPER = f"""
set -e
mkdir -p /etc/systemd/system/vllm@.service.d
printf '[Service]\\nEnvironment=TAMPER=1\\n' > /etc/systemd/system/vllm@.service.d/tamper.conf
systemctl daemon-reload
systemctl disable --quiet vllm@greedy.service
systemctl enable --quiet --runtime vllm@greedy.service
file=$(ls {SITE}/idna/package_data.py)
cp -p "$file" /root/.gpufleet-test-idna
echo '# edited in place' >> "$file"
mkdir -p /boot && : > /boot/vmlinuz-{KERNEL}
"""
RESTORE = f"""
rm -f /etc/systemd/system/vllm@.service.d/tamper.conf /boot/vmlinuz-{KERNEL}
rmdir /etc/systemd/system/vllm@.service.d 2>/dev/null
systemctl daemon-reload
systemctl disable --quiet --runtime vllm@greedy.service
systemctl enable --quiet vllm@greedy.service
[ -f /root/.gpufleet-test-idna ] && cat /root/.gpufleet-test-idna > $(ls {SITE}/idna/package_data.py) \\
  && rm /root/.gpufleet-test-idna
systemctl is-enabled vllm@greedy.service
"""


def layer_of_role() -> dict[str, str]:
    """Role -> the layer whose playbook runs it, from the layer registry."""
    mapping = {}
    for layer in layers.registry():
        if layer.playbook:
            for play in yaml.safe_load((PROJECT_ROOT / "playbooks" / layer.playbook).read_text()):
                for role in play.get("roles", []):
                    mapping[role["role"] if isinstance(role, dict) else role] = layer.name
    return mapping


def changed_tasks(run: Path) -> list[tuple[str, str]]:
    """(role, task) of every task a provision run reported changed, from its job events."""
    changed = []
    for path in sorted(run.glob("artifacts/*/job_events/*.json")):
        event = json.loads(path.read_text())
        data = event.get("event_data", {})
        if event.get("event") in ("runner_on_ok", "runner_item_on_ok") and (data.get("res") or {}).get("changed"):
            changed.append((data.get("role", ""), data.get("task", "")))
    return changed


def fact_gatherings(run: Path) -> Counter[str]:
    """How many times a provision run gathered each host's facts (its plays' implicit setup), from its job events."""
    gathered: Counter[str] = Counter()
    for path in run.glob("artifacts/*/job_events/*.json"):
        event = json.loads(path.read_text())
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and data.get("task") == "Gathering Facts":
            gathered[data.get("host", "")] += 1
    return gathered


@pytest.fixture()
def tampered(lab_inventory: Path, lab_hosts: dict[str, dict]) -> Iterator[str]:
    host = sorted(lab_hosts)[0]
    try:
        rc, text = sh(lab_inventory, host, TAMPER)
        assert rc == 0, text
        yield host
    finally:
        rc, text = sh(lab_inventory, host, RESTORE)
        assert rc == 0 and text.strip().endswith("enabled"), text


def test_drift_sees_the_effective_state_and_agrees_with_provision(
    lab_inventory: Path, tampered: str, tmp_path: Path
) -> None:
    host = tampered
    drift = gpufleet(
        tmp_path,
        "drift",
        "-i",
        str(lab_inventory),
        "--limit",
        host,
        "--layers",
        "driver,venv,serve",
        "--out",
        str(tmp_path / "report"),
    )
    assert drift.returncode == 2, drift.stdout + drift.stderr
    report = last_report(tmp_path)
    serve = {item[:2]: item for item in findings(report, host, "serve")}
    for instance in ("main", "greedy"):
        check = f"service vllm@{instance}.service"
        assert serve[(check, "drop-ins")][3] == json.dumps(
            sorted(
                [
                    "/etc/systemd/system/vllm@.service.d/tamper.conf",
                    f"/etc/systemd/system/vllm@{instance}.service.d/gpufleet.conf",
                ]
            )
        )
    assert serve[("service vllm@greedy.service", "enabled")][2:] == ("true", "enabled-runtime")
    venv = [item for item in findings(report, host, "venv") if item[1].endswith("/idna/package_data.py")]
    assert len(venv) == 1 and venv[0][2].startswith("sha256=") and venv[0][3].startswith("sha256="), venv
    assert (f"kernel {KERNEL}", "nvidia module (DKMS)", "installed", "not built") in findings(report, host, "driver")

    statuses = {layer: item.status for layer, item in report.nodes[host].layers.items()}
    provision = gpufleet(tmp_path, "provision", "-i", str(lab_inventory), "--limit", host, "--tags", "venv,serve")
    assert provision.returncode == 0, provision.stdout[-3000:]
    (run,) = [path for path in tmp_path.iterdir() if path.name.endswith("-site")]
    roles = layer_of_role()
    changed = changed_tasks(run)
    assert ("vllm_service", "Keep the instance enabled at boot: vllm@greedy") in changed
    blind = [(role, task) for role, task in changed if statuses.get(roles.get(role, "?")) != "drifted"]
    assert blind == [], f"provision changed what drift called clean: {blind} (drift: {statuses})"
    # One setup for the whole run (ansible.cfg's gathering = smart), not one in each of its plays.
    assert fact_gatherings(run) == {host: 1}
