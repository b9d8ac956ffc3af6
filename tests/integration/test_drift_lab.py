"""Drift detection and rebuild on the lab fleet, in order (each test builds on the state the previous one left):

1. both nodes converged (base, driver, toolkit, python, venv, kernels, model): no drift on any layer;
2. the first node tampered with in thirteen ways across eight layers, in one go: one drift run reports each on
   its layer with expected -> actual, the second node still reports no drift, `--since` lists the changes,
   and neither node's files changed during the drift run (manifests with sha256 and ctime, before and after);
3. (make test-slow) `gpufleet rebuild --limit NODE` (the drifted layers and those built on them) takes the
   tampered node back to a clean report without touching the other node;
4. (make test-slow) `gpufleet rebuild --limit NODE --full --reinstall driver,toolkit`: every layer built again (a
   new venv, the runfiles reinstalled, the damaged model staged again, the node rebooted to load the declared
   driver) and serving again, without touching the other node.

The serve and proxy layers start vLLM and nginx, which other tests own; they are left out with --layers. After
the module the tampered node is put back by hand from a backup and checked by a drift run (fixture `restored`):
the later modules need a clean node, and a rebuild costs minutes of make test.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_drift_support import (
    LAYERS,
    PROJECT_ROOT,
    assert_unchanged,
    converge,
    fill_mirror,
    findings,
    gpufleet,
    last_report,
    manifest,
    run_playbooks,
)
from test_driver_support import boot_id, sh

sys.path.insert(0, str(PROJECT_ROOT / "tests" / "unit"))
from wheel_factory import make_wheel  # noqa: E402

from gpufleet.lab import mirror  # noqa: E402

pytestmark = pytest.mark.lab

VENV = "/opt/gpufleet/venvs/current"
MODELS = "/var/lib/gpufleet/models"
SIMGPUCTL = "/usr/local/sbin/gpufleet-simgpuctl"
# A pinned package whose module neither torch nor the probes import, replaced by another version.
PACKAGE, OTHER_VERSION = "idna", "2.0"


@pytest.fixture(scope="module")
def fleet(lab_inventory: Path, lab_hosts: dict[str, dict]) -> tuple[Path, str, str]:
    """The lab inventory with two converged nodes: the one tampered with and the one left alone."""
    tampered, untouched = sorted(lab_hosts)[:2]
    fill_mirror(lab_inventory)
    converge(lab_inventory, f"{tampered},{untouched}")
    return lab_inventory, tampered, untouched


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("drift-runs")


@pytest.fixture(scope="module")
def other_version(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A wheel of another version of PACKAGE on the lab mirror; its URL path."""
    wheel = make_wheel(tmp_path_factory.mktemp("wheels"), PACKAGE, OTHER_VERSION)
    url_path = mirror.publish(wheel, f"_tests/drift/{wheel.name}")
    yield url_path
    published = mirror.mirror_dir() / url_path.lstrip("/")
    published.unlink(missing_ok=True)
    published.parent.rmdir()


def pinned_version(name: str) -> str:
    lock = next((PROJECT_ROOT / "inventories" / "lab" / "locks").glob("*.lock")).read_text()
    return re.search(rf"(?m)^{re.escape(name)}==(\S+)", lock).group(1)


def tamper_script(mirror_url: str) -> str:
    return f"""
set -ex
# base: a kernel setting edited by hand, a directory opened up
sed -i 's/^vm.swappiness = 1$/vm.swappiness = 60/' /etc/sysctl.d/90-gpufleet.conf
chmod 0700 /var/log/gpufleet
# driver: the persistence daemon's unit edited (and not reloaded), the daemon stopped; the GPU watchdog stopped
# (running, it would stop the instance on GPU 0 at the ECC errors below)
sed -i 's/^Restart=always$/Restart=no/' /etc/systemd/system/nvidia-persistenced.service
systemctl stop nvidia-persistenced gpufleet-gpu-watchdog
# driver: the module of another driver loaded; gpu_health: uncorrectable ECC errors on GPU 0
{SIMGPUCTL} driver-version 570.133.20
{SIMGPUCTL} ecc-errors --gpu 0 7
# toolkit: the link switched to the other toolkit, the loader entry removed
ln -sfn /usr/local/cuda-12.8 /usr/local/cuda
rm -f /etc/ld.so.conf.d/cuda.conf
# python: pyenv's global version changed
echo system > /opt/pyenv/version
# venv: a pinned package replaced by another version, by hand
PIP_CONFIG_FILE=/dev/null {VENV}/bin/python -m pip install --quiet --no-deps --disable-pip-version-check {mirror_url}
# kernels: the record of the installed kernel build removed
rm -f {VENV}/gpufleet-kernels/gpufleet-kernel-demo.json
# model: a weight file damaged, a generation default changed
printf 'garbage' >> {MODELS}/tiny-qwen2/model.safetensors
sed -i 's/"temperature": 0.0/"temperature": 0.5/' {MODELS}/tiny-qwen2-greedy/generation_config.json
"""


BACKUP = "/var/tmp/gpufleet-tamper-backup"


def backup_script() -> str:
    """Keeps what tamper_script changes, for restore_script: the suite's later modules need a clean node."""
    return f"""
set -ex
rm -rf {BACKUP} && mkdir -p {BACKUP}/venv
cp -a /etc/sysctl.d/90-gpufleet.conf /etc/systemd/system/nvidia-persistenced.service /etc/ld.so.conf.d/cuda.conf \\
      /opt/pyenv/version {VENV}/gpufleet-kernels/gpufleet-kernel-demo.json {BACKUP}/
cp -a {MODELS}/tiny-qwen2/model.safetensors {BACKUP}/model.safetensors
cp -a {MODELS}/tiny-qwen2-greedy/generation_config.json {BACKUP}/generation_config.json
readlink /usr/local/cuda > {BACKUP}/cuda-link
stat -c %a /var/log/gpufleet > {BACKUP}/log-mode
site=$({VENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -a "$site"/{PACKAGE} "$site"/{PACKAGE}-*.dist-info {BACKUP}/venv/
if test -e {VENV}/bin/{PACKAGE}; then cp -a {VENV}/bin/{PACKAGE} {BACKUP}/bin-{PACKAGE}; fi
"""


def restore_script(driver: str) -> str:
    """Puts back what tamper_script changed, by hand: a plain rebuild would take 2.5 minutes of the suite (it is
    test_a_rebuild_of_the_drifted_layers_takes_the_node_back's, in make test-slow)."""
    return f"""
set -ex
cp -a {BACKUP}/90-gpufleet.conf /etc/sysctl.d/ && sysctl -q -p /etc/sysctl.d/90-gpufleet.conf || true
chmod $(cat {BACKUP}/log-mode) /var/log/gpufleet
cp -a {BACKUP}/nvidia-persistenced.service /etc/systemd/system/ && systemctl daemon-reload
{SIMGPUCTL} driver-version {driver}
{SIMGPUCTL} ecc-errors --gpu 0 0
systemctl start nvidia-persistenced gpufleet-gpu-watchdog
ln -sfn $(cat {BACKUP}/cuda-link) /usr/local/cuda
cp -a {BACKUP}/cuda.conf /etc/ld.so.conf.d/ && ldconfig
cp -a {BACKUP}/version /opt/pyenv/version
site=$({VENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$site"/{PACKAGE} "$site"/{PACKAGE}-*.dist-info && cp -a {BACKUP}/venv/. "$site"/
if test -e {BACKUP}/bin-{PACKAGE}; then cp -a {BACKUP}/bin-{PACKAGE} {VENV}/bin/{PACKAGE}; fi
cp -a {BACKUP}/gpufleet-kernel-demo.json {VENV}/gpufleet-kernels/
cp -a {BACKUP}/model.safetensors {MODELS}/tiny-qwen2/model.safetensors
cp -a {BACKUP}/generation_config.json {MODELS}/tiny-qwen2-greedy/generation_config.json
rm -rf {BACKUP}
"""


@pytest.fixture(scope="module")
def restored(fleet: tuple[Path, str, str], runs: Path) -> Iterator[None]:
    """After the module: the tampered node as it was, checked by a drift run."""
    yield
    inventory, tampered, _ = fleet
    stack = yaml.safe_load((PROJECT_ROOT / "inventories" / "lab" / "group_vars" / "all" / "stack.yml").read_text())
    rc, text = sh(inventory, tampered, restore_script(stack["gpufleet_stack"]["driver"]))
    assert rc == 0, text
    result = gpufleet(runs, "drift", "-i", str(inventory), "--limit", tampered, "--layers", LAYERS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_untouched_converged_fleet_reports_no_drift(fleet: tuple[Path, str, str], runs: Path) -> None:
    inventory, tampered, untouched = fleet
    result = gpufleet(runs, "drift", "-i", str(inventory), "--limit", f"{tampered},{untouched}", "--layers", LAYERS)
    assert result.returncode == 0, result.stdout + result.stderr
    report = last_report(runs)
    for host in (tampered, untouched):
        assert {layer: item.status for layer, item in report.nodes[host].layers.items()} == {
            layer: "ok" for layer in LAYERS.split(",")
        }


def test_the_serve_layer_compares_each_declared_instance_and_keeps_its_key_secret(
    fleet: tuple[Path, str, str], runs: Path
) -> None:
    inventory, _, untouched = fleet
    # An instance no node runs: everything of it is missing, whether or not vllm_service runs others there.
    instance = {"name": "drift-probe", "model": f"{MODELS}/tiny-qwen2", "port": 8099, "gpus": []}
    secret = "drift-test-key-0123456789"
    result = gpufleet(
        runs,
        "drift",
        "-i",
        str(inventory),
        "--limit",
        untouched,
        "--layers",
        "serve",
        "-e",
        json.dumps({"vllm_service_instances": [instance], "vllm_service_api_key": secret}),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    serve = findings(last_report(runs), untouched, "serve")
    assert ("file /etc/systemd/system/vllm@drift-probe.service.d/gpufleet.conf", "exists", "present", "absent") in serve
    assert ("file /etc/vllm/drift-probe.env", "exists", "present", "absent") in serve
    assert any(check == "service vllm@drift-probe.service" for check, *_ in serve)
    (health,) = [item for item in serve if item[0] == "endpoint http://127.0.0.1:8099/health"]
    assert health[1:3] == ("status", "200") and health[3].startswith("no answer")
    # Only the env file's digest travels: the key is in no report and no event of the run.
    run = sorted(runs.iterdir())[-1]
    leaked = [
        path
        for path in run.rglob("*")
        if path.is_file() and path.parent.name != "env" and secret in path.read_text(errors="replace")
    ]
    assert leaked == []


def test_every_tamper_is_reported_on_its_layer_and_the_drift_run_writes_nothing(
    fleet: tuple[Path, str, str], runs: Path, other_version: str, lab_hosts: dict[str, dict], restored: None
) -> None:
    inventory, tampered, untouched = fleet
    rc, text = sh(inventory, tampered, backup_script())
    assert rc == 0, text
    rc, text = sh(inventory, tampered, tamper_script(lab_hosts[tampered]["gpufleet_mirror_url"] + other_version))
    assert rc == 0, text
    before = {host: manifest(inventory, host) for host in (tampered, untouched)}

    clean_run = sorted(runs.iterdir())[0].name
    result = gpufleet(
        runs,
        "drift",
        "-i",
        str(inventory),
        "--limit",
        f"{tampered},{untouched}",
        "--layers",
        LAYERS,
        "--since",
        clean_run,
    )

    for host in (tampered, untouched):
        assert_unchanged(before[host], manifest(inventory, host), host)
    assert result.returncode == 2, result.stdout + result.stderr
    report = last_report(runs)
    assert report.nodes[untouched].status == "ok"
    node = report.nodes[tampered]
    assert {layer for layer, item in node.layers.items() if item.status == "drifted"} == set(LAYERS.split(","))

    def pairs(layer: str) -> set[tuple[str, str]]:
        return {(check, field) for check, field, _, _ in findings(report, tampered, layer)}

    base = findings(report, tampered, "base")
    assert ("directory /var/log/gpufleet", "mode", "0755", "0700") in base
    assert ("file /etc/sysctl.d/90-gpufleet.conf", "content") in pairs("base")
    sysctl = next(item for item in node.layers["base"].drift if item.field == "content")
    assert "-vm.swappiness = 1" in sysctl.detail and "+vm.swappiness = 60" in sysctl.detail

    driver = findings(report, tampered, "driver")
    assert ("NVIDIA driver", "loaded", "580.95.05", "570.133.20") in driver
    assert ("service nvidia-persistenced", "active", "active", "inactive (dead)") in driver
    assert ("service gpufleet-gpu-watchdog", "active", "active", "inactive (dead)") in driver
    assert {
        ("file /etc/systemd/system/nvidia-persistenced.service", "content"),
        ("service nvidia-persistenced", "loaded unit"),
    } <= pairs("driver")

    health = {(field, expected, actual) for _, field, expected, actual in findings(report, tampered, "gpu_health")}
    assert {("ecc_errors", "0", "7"), ("persistence", "true", "false")} <= health

    toolkit = findings(report, tampered, "toolkit")
    assert ("link /usr/local/cuda", "target", "/usr/local/cuda-13.0", "/usr/local/cuda-12.8") in toolkit
    assert ("file /etc/ld.so.conf.d/cuda.conf", "exists", "present", "absent") in toolkit

    assert pairs("python") == {("file /opt/pyenv/version", "content")}

    (venv,) = findings(report, tampered, "venv")
    assert venv[1:] == (f"package {PACKAGE}", pinned_version(PACKAGE), OTHER_VERSION)

    (kernel,) = findings(report, tampered, "kernels")
    assert kernel[1] == "build key" and re.fullmatch(r"[0-9a-f]{16}", kernel[2]) and kernel[3] == "no marker"

    model = findings(report, tampered, "model")
    assert ("model tiny-qwen2", "file model.safetensors") in pairs("model")
    assert (
        "model tiny-qwen2-greedy",
        "generation_config.json",
        '{"temperature": 0.0}',
        '{"temperature": 0.5}',
    ) in model

    changes = result.stdout.split(f"changes since {clean_run}", 1)[1]
    assert f"  {tampered} toolkit: ok -> drifted" in changes
    assert (
        f"  {tampered} toolkit: new drift: link /usr/local/cuda: target: /usr/local/cuda-13.0 -> /usr/local/cuda-12.8"
        in changes
    )
    assert untouched not in changes


@pytest.mark.slow
def test_a_rebuild_of_the_drifted_layers_takes_the_node_back(fleet: tuple[Path, str, str], runs: Path) -> None:
    """The everyday repair: rebuild only what drift found (and the layers built on it)."""
    inventory, tampered, untouched = fleet
    # ECC errors are the GPU's own: no rebuild clears them (the report would keep them); the GPU is serviced.
    rc, text = sh(inventory, tampered, f"{SIMGPUCTL} ecc-errors --gpu 0 0")
    assert rc == 0, text
    other_before = manifest(inventory, untouched)

    result = gpufleet(runs, "rebuild", "-i", str(inventory), "--limit", tampered, "--layers", LAYERS)

    assert result.returncode == 0, result.stdout[-8000:] + result.stderr
    assert "(drifted layers and the layers built on them; models staged again from their tarballs: tiny-qwen2)" in (
        result.stdout
    )
    report = last_report(runs)
    assert list(report.nodes) == [tampered]
    assert {layer: item.status for layer, item in report.nodes[tampered].layers.items()} == {
        layer: "ok" for layer in LAYERS.split(",")
    }
    assert_unchanged(other_before, manifest(inventory, untouched), untouched)


@pytest.mark.slow
def test_a_full_rebuild_takes_the_node_back_and_leaves_the_other_alone(
    fleet: tuple[Path, str, str], runs: Path
) -> None:
    inventory, tampered, untouched = fleet
    # ECC errors are the GPU's own: no rebuild clears them (the report would keep them); the GPU is serviced.
    rc, text = sh(inventory, tampered, f"{SIMGPUCTL} ecc-errors --gpu 0 0")
    assert rc == 0, text
    # The node serves before the rebuild (LAYERS leave serve out; in the suite an earlier test started them):
    # what the rebuild stops it must start again.
    serving_now = (
        "systemctl is-active vllm@main vllm@greedy; curl -sk -o /dev/null -w '%{http_code}\\n' https://127.0.0.1/health"
    )
    if sh(inventory, tampered, serving_now)[1].split() != ["active", "active", "200"]:
        run_playbooks(inventory, tampered, ["serve", "proxy"])
    other_before = manifest(inventory, untouched)
    booted = boot_id(inventory, tampered)
    # When the venv in service was created (its pyvenv.cfg is written once, by `python -m venv`) and the
    # installers' logs (rewritten by every install).
    installed = (
        "stat -c %Y $(readlink -f /opt/gpufleet/venvs/current)/pyvenv.cfg; "
        "stat -c %Y /var/log/nvidia-installer.log /var/log/cuda-installer.log"
    )
    venv_in_service = sh(inventory, tampered, "readlink /opt/gpufleet/venvs/current")[1].strip()
    rc, before = sh(inventory, tampered, installed)
    assert rc == 0, before
    # Damage of its own, whatever the tests before left (the rebuild of the drifted layers repairs the tamper
    # test's): a weight file that only staging the model again from its tarball repairs, and another driver's
    # module loaded, which the reinstalled driver can only replace at a reboot.
    rc, text = sh(
        inventory,
        tampered,
        f"printf 'garbage' >> {MODELS}/tiny-qwen2/model.safetensors && {SIMGPUCTL} driver-version 570.133.20",
    )
    assert rc == 0, text

    result = gpufleet(
        runs,
        "rebuild",
        "-i",
        str(inventory),
        "--limit",
        tampered,
        "--layers",
        LAYERS,
        "--full",
        "--reinstall",
        "driver,toolkit",
    )

    assert result.returncode == 0, result.stdout[-8000:] + result.stderr
    assert (
        "rebuild: layers base, driver, toolkit, python, venv, kernels, model (full rebuild; a new venv; "
        "models staged again from their tarballs: tiny-qwen2)"
    ) in result.stdout
    assert boot_id(inventory, tampered) != booted, "the driver layer rebooted the node to load driver 580.95.05"
    rc, after = sh(inventory, tampered, installed)
    assert rc == 0, after
    venv_before, *logs_before = before.split()
    venv_after, *logs_after = after.split()
    assert int(venv_after) > int(venv_before), f"the venv was built again: pyvenv.cfg {venv_before} -> {venv_after}"
    # Beside the one in service, which is kept whole as the previous one (review M12: it was deleted first).
    links = sh(inventory, tampered, "readlink /opt/gpufleet/venvs/current /opt/gpufleet/venvs/previous")[1].split()
    assert links[0] != venv_in_service and ".rebuilt-" in links[0] and links[1] == venv_in_service, links
    assert all(new > old for old, new in zip(logs_before, logs_after, strict=True)), (
        f"the driver and toolkit installers ran again: log times {logs_before} -> {logs_after}"
    )
    report = last_report(runs)
    assert list(report.nodes) == [tampered]
    assert {item.status for item in report.nodes[tampered].layers.values()} == {"ok"}
    assert_unchanged(other_before, manifest(inventory, untouched), untouched)
    # The driver's reinstall stopped the instances and no serve layer ran (--layers leaves it out): the run's
    # last play started them again, health-gated, so the node serves through its proxy.
    serving = sh(inventory, tampered, serving_now)[1]
    assert serving.split() == ["active", "active", "200"], serving
    # Not one failed start on the way: the driver layer rebooted the node in the middle of the rebuild, and an
    # instance still enabled at boot would have crash-looped to start-limit-hit before the run started it again.
    rc, failures = sh(
        inventory,
        tampered,
        "journalctl -b -u vllm@main -u vllm@greedy -o cat --no-pager | grep -E 'Failed with result|Start request repeated' "
        "|| true",
    )
    assert rc == 0 and failures.strip() == "", f"the rebuilt node's instances failed at boot:\n{failures}"
