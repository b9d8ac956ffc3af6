# -*- coding: utf-8 -*-
"""Run the torch stack probe with a venv's interpreter and turn its output into torch_stack_info's report.

Standard library only (shipped to targets). The probe program itself is torch_probe_script.py; the module
passes its source in, writes it to the module's temporary directory and runs it here.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from typing import Any

PROBE_FILE_NAME = "torch_probe_script.py"
# Exception texts from the loader (dlopen) and the CUDA runtime must come in English to match signatures.
PROBE_ENVIRONMENT = {"LANGUAGE": "C", "LC_ALL": "C"}
STDERR_TAIL_CHARS = 4000
SECTIONS = ("python", "packages", "torch", "gpu_compute", "vllm", "flash_attn", "imports")
EXPECT_KEYS = (
    "python_version",
    "torch_version",
    "torch_variant",
    "cuda_available",
    "arch_covers_gpus",
    "vllm_version",
    "flash_attn_version",
    "packages_sha256",
)


class ProbeError(Exception):
    """The venv or interpreter is unusable, or the probe itself failed: the module fails with this message."""


def resolve_interpreter(venv: str | None, python: str | None) -> str:
    """The interpreter to probe: VENV/bin/python, or the given python. Raises ProbeError with the fix."""
    if venv:
        if not os.path.isdir(venv):
            raise ProbeError(
                "venv %s does not exist: create it (python3 -m venv %s) or pass the path of an existing venv"
                % (venv, venv)
            )
        candidate = os.path.join(venv, "bin", "python")
        if not os.path.exists(candidate):
            raise ProbeError(
                "%s has no bin/python, so it is not a venv: pass the venv's root directory, or its "
                "interpreter with python=" % venv
            )
    else:
        candidate = python or ""
        if not os.path.exists(candidate):
            raise ProbeError("python interpreter %s does not exist: pass an existing interpreter path" % candidate)
    if not os.access(candidate, os.X_OK) or os.path.isdir(candidate):
        raise ProbeError("%s is not an executable interpreter: check its mode and owner" % candidate)
    return candidate


def write_probe(source: str, directory: str) -> str:
    """Write the probe source into directory; returns its path."""
    path = os.path.join(directory, PROBE_FILE_NAME)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(source)
    return path


def probe_environment(base: dict | None = None) -> dict:
    """The caller's environment (LD_LIBRARY_PATH, CUDA_VISIBLE_DEVICES matter) with English messages."""
    environment = dict(os.environ if base is None else base)
    environment.update(PROBE_ENVIRONMENT)
    return environment


def run_process(argv: list[str], timeout: int) -> tuple[int | None, str, str, bool]:
    """Run argv in its own process group; (returncode, stdout, stderr, timed_out). Kills the group on timeout."""
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=probe_environment(),
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        timed_out = True
    return (None if timed_out else process.returncode), _text(stdout), _text(stderr), timed_out


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def parse_probe_lines(stdout: str) -> dict:
    """Sections, the section that began without finishing, and the end/fatal records of the probe output."""
    sections: dict = {}
    begun = None
    parsed = {"sections": sections, "stopped_in": None, "ended": False, "fatal": None, "seconds": None}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "begin" in record:
            begun = record["begin"]
        elif "section" in record:
            sections[record["section"]] = record.get("data")
            begun = None
        elif "end" in record:
            parsed["ended"] = True
            parsed["seconds"] = record.get("seconds")
        elif "fatal" in record:
            parsed["fatal"] = record["fatal"]
    parsed["stopped_in"] = begun
    return parsed


def describe_exit(returncode: int | None, timed_out: bool, timeout: int) -> str:
    """'killed by SIGSEGV', 'exit status 1', 'timed out after 300 s'."""
    if timed_out:
        return "timed out after %d s" % timeout
    if returncode is not None and returncode < 0:
        try:
            return "killed by %s" % signal.Signals(-returncode).name
        except ValueError:
            return "killed by signal %d" % -returncode
    return "exit status %s" % returncode


def last_line(text: str) -> str:
    """The last non-empty line (where a Python traceback says what went wrong)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def run_probe(interpreter: str, source: str, options: dict, timeout: int, workdir: str) -> dict:
    """Run the probe; returns the parsed output plus how the process ended. Raises ProbeError on probe failure.

    A process killed by a signal or by the timeout while it was in a section is a state of the venv (a native
    extension that crashes, a GPU that hangs): that is reported, not raised. Anything else that stops the probe
    before its end (a traceback, an interpreter that cannot run it) is a ProbeError.
    """
    path = write_probe(source, workdir)
    argv = [interpreter, "-I", path, json.dumps(options, sort_keys=True)]
    try:
        returncode, stdout, stderr, timed_out = run_process(argv, timeout)
    except OSError as exc:
        raise ProbeError("cannot run %s: %s" % (interpreter, exc))
    parsed = parse_probe_lines(stdout)
    parsed["exit"] = describe_exit(returncode, timed_out, timeout)
    parsed["stderr_tail"] = stderr[-STDERR_TAIL_CHARS:]
    if parsed["fatal"]:
        raise ProbeError("%s cannot run the probe: %s" % (interpreter, parsed["fatal"]))
    if parsed["ended"] and returncode == 0:
        return parsed
    stopped_by_state = timed_out or (returncode is not None and returncode < 0)
    if stopped_by_state and parsed["stopped_in"]:
        return parsed
    raise ProbeError(
        "the probe failed under %s (%s, %s%s): %s"
        % (
            interpreter,
            interpreter_version(interpreter),
            parsed["exit"],
            ", in section %s" % parsed["stopped_in"] if parsed["stopped_in"] else "",
            last_line(stderr) or "no error output",
        )
    )


def interpreter_version(interpreter: str) -> str:
    """`python --version` output, for error messages about interpreters the probe cannot use."""
    try:
        completed = subprocess.run(
            [interpreter, "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "unknown (%s)" % exc
    return _text(completed.stdout).strip() or "unknown"


def packages_sha256(entries: list[str]) -> str:
    """sha256 of the sorted 'name==version' lines joined by newlines: the venv's fingerprint for drift."""
    return hashlib.sha256("\n".join(sorted(entries)).encode("utf-8")).hexdigest()


def torch_variant(version: str | None, cuda: str | None, hip: str | None) -> tuple[str | None, str | None]:
    """(variant, where it came from): the local version suffix ('cu130', 'cpu'), else the build's CUDA/ROCm."""
    if not version:
        return None, None
    if "+" in version:
        return version.split("+", 1)[1], "local version suffix"
    if cuda:
        return "cu" + cuda.replace(".", ""), "torch.version.cuda (no local version suffix)"
    if hip:
        return "rocm" + ".".join(hip.split(".")[:2]), "torch.version.hip (no local version suffix)"
    return "cpu", "no CUDA or ROCm in the build (no local version suffix)"


def public_version(version: str | None) -> str | None:
    """'2.11.0+cu130' -> '2.11.0'."""
    return version.split("+", 1)[0] if version else version


# Keys every report has, so that callers can template them without defaults; null/empty when unknown.
TORCH_DEFAULTS: dict[str, Any] = {
    "installed": False,
    "import_ok": False,
    "version": None,
    "cuda": None,
    "hip": None,
    "cudnn": None,
    "nccl": None,
    "cuda_available": False,
    "device_count": 0,
    "devices": [],
    "arch_list": [],
    "arch_covers_gpus": None,
    "arch_coverage": [],
}
VLLM_DEFAULTS = {"installed": False, "distribution": None, "version": None, "import_ok": None, "extension_ok": None}
FLASH_ATTN_DEFAULTS = {
    "installed": False,
    "version": None,
    "import_ok": None,
    "kernel": {"requested": False, "ran": False},
}


def _with_defaults(data: dict | None, defaults: dict) -> dict:
    merged = dict(defaults)
    merged.update(data or {})
    return merged


def _torch_report(data: dict | None) -> dict:
    torch = _with_defaults(data, TORCH_DEFAULTS)
    torch["variant"], torch["variant_source"] = torch_variant(torch["version"], torch["cuda"], torch["hip"])
    return torch


def build_report(parsed: dict, interpreter: str, options: dict) -> dict:
    """The module's result from the parsed probe output (arch coverage and diagnosis are added by the caller)."""
    sections = parsed["sections"]
    packages = (sections.get("packages") or {}).get("list", [])
    report = {
        "interpreter": interpreter,
        "python": sections.get("python") or {},
        "torch": _torch_report(sections.get("torch")),
        "gpu_compute": sections.get("gpu_compute") or {"ran": False, "reason": "not requested"},
        "vllm": _with_defaults(sections.get("vllm"), VLLM_DEFAULTS),
        "flash_attn": _with_defaults(sections.get("flash_attn"), FLASH_ATTN_DEFAULTS),
        "imports": sections.get("imports") or [],
        "packages": packages,
        "packages_sha256": packages_sha256(packages),
        "probe": {
            "complete": parsed["ended"],
            "stopped_in": parsed["stopped_in"],
            "exit": parsed["exit"],
            "seconds": parsed["seconds"],
        },
    }
    report["gpu_compute"]["requested"] = bool(options.get("gpu_compute"))
    if not parsed["ended"]:
        report["probe"]["stderr_tail"] = parsed["stderr_tail"]
    return report


def torch_gpus(report: dict, given_capabilities: list[str]) -> list[dict]:
    """The GPUs to check the arch list against: those torch sees, plus capabilities given by the caller."""
    gpus = [
        {"index": device["index"], "name": device["name"], "capability": device["capability"], "source": "torch"}
        for device in report["torch"].get("devices", [])
        if "capability" in device
    ]
    gpus.extend({"capability": capability, "source": "gpu_capabilities"} for capability in given_capabilities)
    return gpus


def _actual_values(report: dict) -> dict:
    torch = report["torch"]
    return {
        "python_version": report["python"].get("version"),
        "torch_version": torch.get("version"),
        "torch_variant": torch.get("variant"),
        "cuda_available": torch.get("cuda_available"),
        "arch_covers_gpus": torch.get("arch_covers_gpus"),
        "vllm_version": report["vllm"].get("version"),
        "flash_attn_version": report["flash_attn"].get("version"),
        "packages_sha256": report["packages_sha256"],
    }


def _matches(key: str, expected, actual) -> bool:
    if actual is None:
        return False
    if key == "python_version":
        wanted = str(expected).split(".")
        return str(actual).split(".")[: len(wanted)] == wanted
    if key in ("torch_version", "vllm_version", "flash_attn_version"):
        # '2.11.0' accepts any local variant of it; '2.11.0+cu130' only that one.
        compared = actual if "+" in str(expected) else public_version(actual)
        return compared == str(expected)
    if key == "torch_variant":
        return str(actual).lower() == str(expected).lower()
    return actual == expected


def check_expect(report: dict, expect: dict | None) -> list[dict]:
    """Every expectation that the report does not meet, as {key, expected, actual}."""
    actual = _actual_values(report)
    mismatches = []
    for key in EXPECT_KEYS:
        expected = (expect or {}).get(key)
        if expected is None:
            continue
        if not _matches(key, expected, actual[key]):
            mismatches.append({"key": key, "expected": expected, "actual": actual[key]})
    return mismatches


def mismatch_message(mismatches: list[dict]) -> str:
    """One line naming every mismatch."""
    parts = [
        "%s: expected %s, found %s" % (item["key"], json.dumps(item["expected"]), json.dumps(item["actual"]))
        for item in mismatches
    ]
    return "%d expectation(s) not met: %s" % (len(mismatches), "; ".join(parts))
