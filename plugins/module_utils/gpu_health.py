"""Whether a node's GPUs are fit to serve: XID errors in the kernel log, NVML's ECC, row remapping and lost
GPUs, and DCGM's diagnostic where it is installed.

Standard library only: this file is shipped to targets with the gpu_health module, and the controller's
`gpufleet doctor` reads the same XID lines with it.

The kernel logs an XID as `NVRM: Xid (PCI:0000:44:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off
the bus.` (NVIDIA's XID catalog, docs.nvidia.com/deploy/xid-errors; the form seen in NVIDIA/NVSentinel#155).
Which XIDs stop a node: NVIDIA's catalog gives each XID an immediate action; those whose action is restarting
the application (a program's own fault, the GPU is fine) are XID_APPLICATION_ERRORS and do not fail the gate.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Callable, Iterable

XID_PATTERN = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+), ?(?P<detail>.*)")
# A boot banner in a kernel log file that spans several boots (rsyslog's /var/log/kern.log): what follows the
# last one is this boot.
BOOT_BANNER = re.compile(r"kernel: Linux version |^Linux version ")

# XIDs NVIDIA's catalog answers with RESTART_APP: a CUDA program's own error (graphics engine exception,
# MMU fault from a bad address, a stopped channel after the program's fault, preemptive cleanup).
XID_APPLICATION_ERRORS = (13, 31, 43, 45)

# What the most frequent hardware XIDs mean (NVIDIA's XID catalog and its page retirement / row remapping
# guides), for the message an operator reads.
XID_MEANING = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded (reset the GPU to activate)",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

# DCGM levels: 1 takes seconds (a readiness gate), 2 about two minutes, 3 about fifteen.
DCGM_LEVELS = (1, 2, 3, 4)


# journalctl, dmesg and dcgmi live in sbin directories on some systems, which a module's PATH may lack.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
# A read-only command with a fixed locale: argv -> (rc, stdout, stderr).
Runner = Callable[[list], "tuple[int, str, str]"]


def read_kernel_log(source: str, run: Runner) -> tuple[list[str], str | None]:
    """This boot's kernel log lines (the journal's, or a file's), or ([], why) when they cannot be read."""
    if source != "journal":
        try:
            with open(source, encoding="utf-8", errors="replace") as stream:
                return kernel_log_this_boot(stream), None
        except OSError as error:
            return [], "cannot read %s: %s" % (source, error)
    journalctl = shutil.which("journalctl", path=SEARCH_PATH)
    command = [journalctl, "-k", "-b", "0", "-o", "short-iso", "--no-pager", "-q"] if journalctl else ["dmesg"]
    rc, out, err = run(command)
    if rc != 0:
        return [], "%s exited %d: %s" % (command[0], rc, err.strip())
    return out.splitlines(), None


def run_dcgm(level: int, run: Runner) -> dict[str, Any]:
    """`dcgmi diag -r LEVEL` where DCGM is installed and the level is not 0: whether it ran, and what it said."""
    dcgmi = shutil.which("dcgmi", path=SEARCH_PATH)
    if level == 0 or not dcgmi:
        return {"ran": False, "level": level, "rc": None, "output": ""}
    rc, out, err = run([dcgmi, "diag", "-r", str(level)])
    return {"ran": True, "level": level, "rc": rc, "output": out + err}


def kernel_log_this_boot(lines: Iterable[str]) -> list[str]:
    """The lines after the last boot banner; all of them when there is none (journalctl -k -b is one boot)."""
    kept: list[str] = []
    for line in lines:
        if BOOT_BANNER.search(line):
            kept = []
        kept.append(line.rstrip("\n"))
    return kept


def parse_xids(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Every XID line: pci, xid, detail, the line itself."""
    found = []
    for line in lines:
        match = XID_PATTERN.search(line)
        if match:
            found.append(
                {
                    "pci": match.group("pci").lower(),
                    "xid": int(match.group("xid")),
                    "detail": match.group("detail").strip(),
                    "line": line.strip(),
                }
            )
    return found


def xid_problems(xids: list[dict[str, Any]], ignore: Iterable[int]) -> list[dict[str, Any]]:
    """One problem per distinct (PCI, XID) that is not ignored, with its first line as evidence."""
    ignored = set(ignore)
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for event in xids:
        key = (event["pci"], event["xid"])
        if event["xid"] in ignored:
            continue
        if key in seen:
            seen[key]["count"] += 1
            continue
        meaning = XID_MEANING.get(event["xid"], "see NVIDIA's XID catalog")
        seen[key] = {
            "check": "xid",
            "gpu_pci": event["pci"],
            "xid": event["xid"],
            "count": 1,
            "evidence": event["line"],
            "message": "XID %d on the GPU at PCI %s since boot (%s)" % (event["xid"], event["pci"], meaning),
        }
    for problem in seen.values():
        if problem["count"] > 1:
            problem["message"] += ", %d times" % problem["count"]
    return list(seen.values())


def nvml_problems(report: dict[str, Any], ecc_errors_max: int) -> list[dict[str, Any]]:
    """Lost GPUs, uncorrectable ECC errors over the limit, pending or failed row remapping / page retirement."""
    problems = []
    for gpu in report["gpus"]:
        where = "GPU %d (%s)" % (gpu["index"], gpu.get("uuid") or "uuid unknown")
        if gpu["lost"]:
            problems.append(
                {
                    "check": "lost",
                    "gpu": gpu["index"],
                    "evidence": gpu["errors"].get("gpu", "lost"),
                    "message": "%s is lost (fell off the bus): reboot the node; reseat or replace the GPU "
                    "if it stays lost" % where,
                }
            )
            continue
        problems.extend(_gpu_problems(gpu, where, ecc_errors_max))
    return problems


def _gpu_problems(gpu: dict[str, Any], where: str, ecc_errors_max: int) -> list[dict[str, Any]]:
    found = []
    errors = gpu.get("ecc_errors_uncorrected_volatile")
    if errors is not None and errors > ecc_errors_max:
        found.append(
            (
                "ecc",
                "ecc_errors_uncorrected_volatile=%d" % errors,
                "%d uncorrectable volatile ECC errors (at most %d allowed): drain the node and reset the GPU"
                % (errors, ecc_errors_max),
            )
        )
    if gpu.get("row_remap_failure"):
        found.append(
            (
                "row_remap",
                "row_remap_failure=true",
                "row remapping failed: the GPU's memory cannot be repaired, the GPU needs service",
            )
        )
    elif gpu.get("row_remap_pending"):
        found.append(
            ("row_remap", "row_remap_pending=true", "a row remapping is pending: reset the GPU (or reboot) to apply it")
        )
    if gpu.get("retired_pages_pending"):
        found.append(
            (
                "retired_pages",
                "retired_pages_pending=true",
                "retired pages are pending: reboot (or reset the GPU) to retire them",
            )
        )
    return [
        {"check": check, "gpu": gpu["index"], "evidence": evidence, "message": "%s: %s" % (where, message)}
        for check, evidence, message in found
    ]


def dcgm_problems(rc: int, output: str, level: int) -> list[dict[str, Any]]:
    """The problems in what `dcgmi diag -r LEVEL` printed: one per test whose result is Fail (or Error).

    Three shapes are read, in this order (real outputs of each are in tests/fixtures/dcgm, with their sources):

    - JSON (`dcgmi diag -j`, DCGM 3 and 4): every test under "DCGM GPU Diagnostic" (3.x) or "DCGM Diagnostic" (4.x)
      > test_categories > tests whose per-GPU result or 4.x test_summary has status Fail or Error, with the failing
      GPUs' ids (3.x gpu_id, 4.x entity_id of entity_group GPU) and their warnings (or, without any, their info)
      as evidence. A document with a runtime_error and no test is DCGM not running.
    - The table dcgmi prints without -j: a test row whose result cell is Fail (3.x `Fail`, `Fail - All`,
      `Fail - GPU: 0`, a later `Fail - GPUs: 0, 1` row; 4.x `Fail` with `GPU0: Fail` rows under it), with the
      `Warning`/`Error` rows that follow it (3.x `Warning`, 4.x `Warning` and `Warning: GPU0`; their text wrapped
      at 45 characters is joined back) as evidence.
    - Neither, with a non-zero exit status: dcgmi could not run the diagnostic (no host engine, a MIG layout it
      refuses, a test name it does not know); the last line it printed is the evidence and the message says DCGM
      could not run, not that the GPUs failed.

    Warn and Skip results are not problems: a run whose tests are Pass, Warn or Skip gives none, whatever the exit
    status (DCGM 4 exits non-zero when a test only warned, dcgmi/Diag.cpp GetFailureResult). A warning (persistence
    mode off, say) is a node setting to look at, not a GPU unfit to serve; it stays readable in the module's
    dcgm.output. This is also why the module runs dcgmi without -j: the JSON of both DCGM 3 and 4 writes a Warn
    result as "Fail" (Diag.cpp HelperDisplayDiagResult; dcgmi's own unit test expects a warned test's
    test_summary to say Fail), where the table still says Warn in the 4.x test row (the `GPU0: Fail` rows under
    a Warn row are that warning) and in the 3.x per-GPU tests' `Warn - All` / `Warn - GPU: 0`. A JSON Fail is
    therefore taken as a failure, and a Warn-only DCGM 4 run read from JSON fails the gate.

    Without --host, `dcgmi diag` starts an embedded host engine when nv-hostengine is not running (DCGM 3.0.4 to
    4.6.0, StartDiag::DoExecuteConnectionFailure), so "unable to establish a connection" is rarely what it prints.
    """
    report = _dcgm_json_report(output)
    if report is None:
        report = _dcgm_table_report(output)
    if report["tests"]:
        return [_dcgm_failure(test, rc, level) for test in report["tests"] if test["failed"]]
    if rc == 0 and not report["error"]:
        return []
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    evidence = report["error"] or (lines[-1] if lines else "no output")
    return [
        {
            "check": "dcgm",
            "gpu": None,
            "gpus": [],
            "test": None,
            "evidence": evidence,
            "message": "DCGM could not run: %s (dcgmi diag -r %d, exit status %d)" % (evidence, level, rc),
        }
    ]


# Most messages quoted in evidence before the rest are counted, and the longest one quoted.
DCGM_EVIDENCE_MESSAGES = 2
DCGM_MESSAGE_CHARS = 400
# The table's result column: dcgmi/Diag.cpp cuts longer text into pieces of this many characters, one a row.
DCGM_TABLE_PIECE = 45
DCGM_JSON_ROOTS = ("DCGM GPU Diagnostic", "DCGM Diagnostic")
DCGM_FAILED = ("fail", "error")
_DCGM_SECTION = re.compile(r"^[|+]-----\s+(\w+)\s+-*\+")
# A test's result cell, DCGM 3 (`Fail - All`, `Pass - GPU: 1`, `Fail - GPUs: 0, 1`) and 4 (`Fail`).
_DCGM_RESULT = re.compile(r"^(Pass|Fail|Warn|Skip|Not Run|Error)(?: - (All|GPUs?: ([\d, ]+)))?$")
# DCGM 4's result of one entity under its test's row: `GPU0: Fail`.
_DCGM_ENTITY_RESULT = re.compile(r"^([A-Za-z_]+?)(\d+): (Pass|Fail|Warn|Skip|Not Run)$")
# The label of a message row: `Warning`, `Error`, `Info`, DCGM 4 adding the entity (`Warning: GPU0`).
_DCGM_LABEL = re.compile(r"^(Warning|Error|Info)(?:: ([A-Za-z_]+?)(\d+))?$")


def _dcgm_test(name: str) -> dict[str, Any]:
    return {"name": name, "failed": False, "all": False, "gpus": [], "warnings": [], "info": []}


def _dcgm_json_report(output: str) -> dict[str, Any] | None:
    """The tests of a `dcgmi diag -j` document, or None where the output is not one."""
    start = output.find("{")
    if start < 0:
        return None
    try:
        document = json.JSONDecoder().raw_decode(output[start:])[0]
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    roots = list(_dcgm_json_roots(document))
    if not roots:
        return None
    report: dict[str, Any] = {"tests": [], "error": None}
    for root in roots:
        if isinstance(root.get("runtime_error"), str) and not report["error"]:
            report["error"] = root["runtime_error"].strip()
        for category in _dicts(root.get("test_categories")):
            for entry in _dicts(category.get("tests")):
                report["tests"].append(_dcgm_json_test(entry))
    return report


def _dcgm_json_roots(document: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for key in DCGM_JSON_ROOTS:
        if isinstance(document.get(key), dict):
            yield document[key]
    for iteration in _dicts(document.get("iterations")):  # dcgmi diag --iterations N -j
        yield from _dcgm_json_roots(iteration)


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The objects of a JSON array (jsoncpp writes null where dcgmi skipped an index)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _dcgm_json_test(entry: dict[str, Any]) -> dict[str, Any]:
    test = _dcgm_test(str(entry.get("name") or "unnamed test"))
    failing = [result for result in _dicts(entry.get("results")) if _json_failed(result)]
    summary: dict[str, Any] = entry["test_summary"] if isinstance(entry.get("test_summary"), dict) else {}
    test["failed"] = bool(failing) or _json_failed(summary)
    for result in failing:
        for gpu in _json_gpus(result):
            if gpu not in test["gpus"]:
                test["gpus"].append(gpu)
    for source in failing + ([summary] if test["failed"] else []):
        _add_new(test["warnings"], _json_texts(source.get("warnings"), ("warning", "warnings")))
        _add_new(test["info"], _json_texts(source.get("info"), ()))
    return test


def _json_failed(result: dict[str, Any]) -> bool:
    return str(result.get("status", "")).strip().lower() in DCGM_FAILED


def _json_gpus(result: dict[str, Any]) -> list[int]:
    """The GPUs one result is about: 4.x entity_id of entity_group GPU, 3.x gpu_id, nvvs's gpu_ids "0,1"."""
    if "entity_id" in result:
        if str(result.get("entity_group", "GPU")) != "GPU":
            return []
        ids: Any = [result["entity_id"]]
    elif "gpu_id" in result:
        ids = [result["gpu_id"]]
    else:
        ids = str(result.get("gpu_ids", "")).split(",")
    return [int(str(gpu).strip()) for gpu in ids if str(gpu).strip().isdigit()]


def _json_texts(value: Any, keys: tuple[str, ...]) -> list[str]:
    """The strings of an info or warnings field: a string, a list of strings, or a list of {"warning": ...}
    (DCGM 3 writes the deployment tests' message under "warnings" inside each entry)."""
    items = value if isinstance(value, list) else [value]
    texts = []
    for item in items:
        if isinstance(item, dict):
            item = next((item[key] for key in keys if isinstance(item.get(key), str)), None)
        if isinstance(item, str) and item.strip():
            texts.append(" ".join(item.split()))
    return texts


def _add_new(kept: list[str], texts: list[str]) -> None:
    for text in texts:
        if text not in kept:
            kept.append(text)


def _dcgm_table_report(output: str) -> dict[str, Any]:
    """The tests of the table dcgmi prints without -j (their rows are `| name | result |`)."""
    tests: list[dict[str, Any]] = []
    section = None
    test: dict[str, Any] | None = None
    message: dict[str, Any] | None = None  # the Warning/Error/Info row that later rows with no label continue
    messages: list[dict[str, Any]] = []
    for line in output.splitlines():
        line = line.rstrip()
        found = _DCGM_SECTION.match(line)
        if found:
            section, message = found.group(1), None
            continue
        if not (line.startswith("|") and line.endswith("|")) or section in (None, "Metadata"):
            continue
        name, separator, cell = line[1:-1].partition("|")
        if not separator:
            continue
        name = name.strip()
        cell = cell[1:] if cell.startswith(" ") else cell
        text = cell.strip()
        if (name, text) == ("Diagnostic", "Result"):  # the header of a second table (srun prints one a task)
            section, test, message = None, None, None
            continue
        label = _DCGM_LABEL.match(name)
        if name and not label:
            test = _dcgm_test(name)
            tests.append(test)
            message = None
            _table_result(test, text, first=True)
        elif label and test is not None:
            message = {"test": test, "kind": label.group(1), "pieces": [cell[:DCGM_TABLE_PIECE]]}
            messages.append(message)
        elif not name and test is not None:
            entity = _DCGM_ENTITY_RESULT.match(text)
            if entity:
                if entity.group(1) == "GPU" and entity.group(3) == "Fail":
                    test["gpus"].append(int(entity.group(2)))
                message = None
            elif _DCGM_RESULT.match(text) and " - " in text:
                _table_result(test, text, first=False)
                message = None
            elif message is not None:
                message["pieces"].append(cell[:DCGM_TABLE_PIECE])
    for message in messages:
        text = " ".join("".join(message["pieces"]).split())
        kept = message["test"]["info" if message["kind"] == "Info" else "warnings"]
        _add_new(kept, [text] if text else [])
    return {"tests": tests, "error": None}


def _table_result(test: dict[str, Any], text: str, first: bool) -> None:
    """Read one result cell into the test: its verdict (a DCGM 3 test is failed if any of its cells says Fail)
    and the GPUs a `Fail - GPU: 0` cell names."""
    found = _DCGM_RESULT.match(text)
    if not found or found.group(1) not in ("Fail", "Error"):
        return
    test["failed"] = True
    if found.group(2) == "All":
        test["all"] = True
    elif found.group(3):
        test["gpus"].extend(int(gpu) for gpu in found.group(3).replace(" ", "").split(",") if gpu)


def _dcgm_failure(test: dict[str, Any], rc: int, level: int) -> dict[str, Any]:
    # A DCGM 3 `Fail - All` cell names no GPU: gpus stays empty and the message says all of them.
    gpus = [] if test["all"] else sorted(set(test["gpus"]))
    if test["all"]:
        where = " on all GPUs"
    elif gpus:
        where = " on GPU%s %s" % ("s" if len(gpus) > 1 else "", ", ".join(str(gpu) for gpu in gpus))
    else:
        where = ""
    texts = test["warnings"] or test["info"]
    quoted = [_shorten(text) for text in texts[:DCGM_EVIDENCE_MESSAGES]]
    if len(texts) > DCGM_EVIDENCE_MESSAGES:
        quoted.append("and %d more" % (len(texts) - DCGM_EVIDENCE_MESSAGES))
    evidence = "%s: %s" % (test["name"], "; ".join(quoted) if quoted else "Fail")
    return {
        "check": "dcgm",
        "gpu": gpus[0] if len(gpus) == 1 else None,
        "gpus": gpus,
        "test": test["name"],
        "evidence": evidence,
        "message": "DCGM diagnostic level %d: test %s failed%s (dcgmi exit status %d): %s"
        % (level, test["name"], where, rc, evidence),
    }


def _shorten(text: str) -> str:
    return text if len(text) <= DCGM_MESSAGE_CHARS else text[: DCGM_MESSAGE_CHARS - 3] + "..."
