"""Time to serving of one compiled vLLM instance, side by side in one run (issue 33):

  (a) cold:    a node with no compile cache (what every fresh node paid before caches were shipped);
  (b) warm:    a restart on the same node, on the caches its cold start left;
  (c) shipped: a fresh node given the cache (a) built, packed and installed by the vllm_compile_cache module as
               the vllm_service role does, then started.

Usage: .venv/bin/python bench/time_to_serving.py -i INVENTORY [--instance main] [--builder HOST] [--fresh HOST]

The instance runs compiled (enforce_eager false) for the benchmark, through serve.yml with extra variables, and is
put back as the inventory declares it at the end. FRESH defaults to the builder itself made fresh again (its caches
and their record removed); give a second host of the same key (same wheels, CPU or GPU kind, compilers) to ship
across nodes. Each start is timed on the node (systemctl start until /health answers, then one completion), and
vLLM's own phases are read from its journal (plugins/plugin_utils/vllm_start.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from gpufleet.inventory import inventory_hosts  # noqa: E402  (gpufleet puts the collection on the path)
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.vllm_start import start_phases  # noqa: E402  isort: skip

BIN = Path(sys.executable).parent
HOMES = "/var/cache/private/vllm"
CACHES = ("vllm", "torchinductor", "triton", "flashinfer")
# Run on the node: stop the instance, (optionally) remove its caches, start it and time /health and one completion.
START = r"""
set -eu
instance=$1 wipe=$2
home={homes}/$instance
dropin=/etc/systemd/system/vllm@$instance.service.d/gpufleet.conf
port=$(grep -o '"--port" "[0-9]*"' $dropin | grep -o '[0-9][0-9]*')
name=$(grep -o '"--served-model-name" "[^"]*"' $dropin | cut -d'"' -f4)
key=$(sed -n 's/^VLLM_API_KEY=//p' /etc/vllm/$instance.env | tr -d '"')
systemctl stop vllm@$instance
if [ "$wipe" = yes ]; then
    for cache in {caches}; do rm -rf "$home/.cache/$cache"; done
    rm -f "$home/.gpufleet-compile-cache.json"
fi
cursor=$(journalctl -u vllm@$instance -n 0 --show-cursor -o cat | sed -n 's/^-- cursor: //p')
# Deliberate starts, as the role's: a fresh start-limit count (the benchmark restarts more often than systemd allows).
systemctl reset-failed vllm@$instance
t0=$(date +%s.%N)
systemctl start vllm@$instance
until curl -sf -o /dev/null http://127.0.0.1:$port/health; do
    if systemctl is-failed -q vllm@$instance; then echo "vllm@$instance failed" >&2; exit 1; fi
    sleep 0.2
done
t1=$(date +%s.%N)
curl -sf -o /dev/null -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d "{{\"model\": \"$name\", \"prompt\": \"hello\", \"max_tokens\": 8}}" http://127.0.0.1:$port/v1/completions
t2=$(date +%s.%N)
echo "TIMES $t0 $t1 $t2"
journalctl -u vllm@$instance --after-cursor "$cursor" -o cat --no-pager
"""


def ansible(inventory: Path, host: str, module: str, args: str, one_line: bool = True) -> str:
    """The module's output on HOST (one line per host unless ONE_LINE is false); exits when it fails."""
    result = subprocess.run(
        [str(BIN / "ansible"), "-i", str(inventory), host, "-m", module, "-a", args] + (["-o"] if one_line else []),
        capture_output=True,
        text=True,
        check=False,
        cwd=PROJECT_ROOT,
    )
    if result.returncode != 0:
        sys.exit(f"{module} on {host} failed:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    return result.stdout


def run_on(inventory: Path, host: str, script: str, *arguments: str) -> str:
    """The script's output, run through ansible's raw ssh (its stdout, whole)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as handle:
        handle.write(script)
    remote = f"/var/tmp/gpufleet-bench-{Path(handle.name).name}"
    ansible(inventory, host, "ansible.builtin.copy", f"src={handle.name} dest={remote} mode=0700")
    Path(handle.name).unlink()
    command = f"bash {remote} {' '.join(arguments)}; rc=$?; rm -f {remote}; exit $rc"
    return ansible(inventory, host, "ansible.builtin.raw", command, one_line=False)


def serve(inventory: Path, hosts: list[str], extra_vars: Path | None) -> None:
    command = [str(BIN / "ansible-playbook"), "-i", str(inventory), "--limit", ",".join(hosts), "playbooks/serve.yml"]
    command += ["-e", json.dumps({"vllm_service_warmup_requests": [{"name": "probe", "max_tokens": 1}]})]
    if extra_vars:
        command += ["-e", f"@{extra_vars}"]
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=PROJECT_ROOT)
    if result.returncode != 0:
        sys.exit(f"serve.yml on {', '.join(hosts)} failed:\n{result.stdout[-4000:]}")


def timed_start(inventory: Path, host: str, instance: str, wipe: bool) -> dict:
    script = START.format(homes=HOMES, caches=" ".join(CACHES))
    output = run_on(inventory, host, script, instance, "yes" if wipe else "no")
    line = next(line for line in output.splitlines() if line.startswith("TIMES "))
    t0, t1, t2 = (float(value) for value in line.split()[1:4])
    phases = start_phases(output)
    return {
        "healthy": t1 - t0,
        "first_completion": t2 - t0,
        "engine_init": phases.seconds.get("engine_init"),
        "to_server_start": phases.to_server_start,
    }


def compiled_vars(instance: str, controller_dir: Path) -> dict:
    serve_vars = yaml.safe_load((PROJECT_ROOT / "inventories" / "lab" / "group_vars" / "all" / "serve.yml").read_text())
    declared = next(item for item in serve_vars["vllm_service_instances"] if item["name"] == instance)
    return {
        "vllm_service_prune": False,
        "vllm_service_compile_cache_controller_dir": str(controller_dir),
        "vllm_service_instances": [dict(declared, enforce_eager=False)],
    }


def ship(inventory: Path, builder: str, fresh: str, instance: str, work: Path) -> None:
    """Pack the builder's caches, bring them here and install them on FRESH, as the role does."""
    common = {"venv": "/opt/gpufleet/venvs/current", "home": f"{HOMES}/{instance}"}
    declared = compiled_vars(instance, work)["vllm_service_instances"][0]
    common["instance"] = declared
    archive = f"/var/tmp/gpufleet-bench-{instance}.tar"
    packed = ansible(
        inventory,
        builder,
        "gpufleet.fleet.vllm_compile_cache",
        json.dumps(dict(common, state="packed", archive=archive)),
    )
    result = json.loads(packed.split("=>", 1)[1])
    ansible(inventory, builder, "ansible.builtin.fetch", f"src={archive} dest={work}/cache.tar flat=true")
    ansible(inventory, builder, "ansible.builtin.file", f"path={archive} state=absent")
    run_on(
        inventory,
        fresh,
        f"systemctl stop vllm@{instance}; for cache in {' '.join(CACHES)}; do rm -rf {HOMES}/{instance}/.cache/$cache; done; rm -f {HOMES}/{instance}/.gpufleet-compile-cache.json",
    )
    ansible(inventory, fresh, "ansible.builtin.copy", f"src={work}/cache.tar dest={archive} mode=0600")
    installed = dict(common, state="installed", archive=archive, sha256=result["sha256"], key=result["key"])
    output = ansible(inventory, fresh, "gpufleet.fleet.vllm_compile_cache", json.dumps(installed))
    if '"refused"' in output:
        sys.exit(f"the cache was refused on {fresh}: {output[-2000:]}")
    ansible(inventory, fresh, "ansible.builtin.file", f"path={archive} state=absent")
    print(f"shipped {result['size'] / 1e6:.1f} MB ({', '.join(result['directories'])}), key {result['key']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", type=Path, required=True)
    parser.add_argument("--instance", default="main")
    parser.add_argument("--builder", help="the node of the cold and warm starts (default: the first gpu node)")
    parser.add_argument("--fresh", help="the node given the shipped cache (default: the builder, made fresh)")
    options = parser.parse_args()
    hosts = inventory_hosts(options.inventory)
    builder = options.builder or hosts[0]
    fresh = options.fresh or builder
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-tts-") as directory:
        work = Path(directory)
        extra = work / "compiled.yml"
        extra.write_text(yaml.safe_dump(compiled_vars(options.instance, work / "caches")))
        targets = sorted({builder, fresh})
        serve(options.inventory, targets, extra)
        try:
            figures = {
                "(a) cold": timed_start(options.inventory, builder, options.instance, wipe=True),
                "(b) warm restart": timed_start(options.inventory, builder, options.instance, wipe=False),
            }
            ship(options.inventory, builder, fresh, options.instance, work)
            figures["(c) shipped cache"] = timed_start(options.inventory, fresh, options.instance, wipe=False)
        finally:
            serve(options.inventory, targets, None)
    print(f"vllm@{options.instance}, compiled; built on {builder}, shipped to {fresh} (seconds)")
    print(f"{'start':<20}{'healthy':>10}{'1st completion':>16}{'engine init':>13}{'to server':>11}")
    for name, row in figures.items():
        engine = "-" if row["engine_init"] is None else f"{row['engine_init']:.1f}"
        server = "-" if row["to_server_start"] is None else f"{row['to_server_start']:.0f}"
        print(f"{name:<20}{row['healthy']:>10.1f}{row['first_completion']:>16.1f}{engine:>13}{server:>11}")
    base = figures["(b) warm restart"]["healthy"]
    print(f"(c)/(b) time to healthy: {figures['(c) shipped cache']['healthy'] / base:.2f}")
    print(f"(a)/(c) time to healthy: {figures['(a) cold']['healthy'] / figures['(c) shipped cache']['healthy']:.2f}")


if __name__ == "__main__":
    main()
