"""Stack resolution shared by the gpufleet_stack lookup and the stack_validate action (controller only): the
host variables it reads, the validation against the knowledge base and the artifacts it resolves, cached per
process and on the controller's disk.

Ansible forks a worker per task and host, and each worker that templates a role default reads the stack through
the lookup: parsing the knowledge base's CSVs there cost 10-15 ms per task and host, minutes over a fleet's
provision. The outcome is therefore kept on disk (the temporary directory, one file per inputs and knowledge base),
keyed by the inputs, the knowledge base's files and the validator's own code (names, sizes, modification times):
a changed table or validator is a new key, never a stale answer."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_kb

_CACHE: dict = {}


def kb_dir() -> str:
    return os.environ.get("GPUFLEET_COMPAT_DIR") or stack_kb.default_kb_dir()


def plain(value: object) -> object:
    """Templated inventory values arrive as Ansible's str/dict subclasses: make them plain for type checks."""
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, str):
        return str(value)
    return value


def inputs_of(variables: dict) -> dict:
    """The host variables stack resolution reads (already templated, plain)."""
    return {
        "stack": plain(variables.get("gpufleet_stack")),
        "mirror_url": plain(variables.get("gpufleet_mirror_url")),
        "pins": plain(variables.get("gpufleet_artifact_sha256") or {}),
        "extra_toolkits": plain(variables.get("cuda_toolkit_extra_versions") or []),
        "venv_options": plain(variables.get("inference_venv_stack_options") or {}),
        "pyenv_version": plain(variables.get("pyenv_python_pyenv_version") or ""),
    }


def with_platform(stack: dict, inputs: dict) -> dict:
    """The stack with the nodes' platform: its own, else the one the wheelhouse is declared for
    (inference_venv_stack_options.platform), so the wheels are checked for the platform they are fetched for."""
    declared = (inputs.get("venv_options") or {}).get("platform")
    if stack.get("platform") is None and declared:
        return dict(stack, platform=str(declared))
    return stack


def _fingerprint(directories: tuple[str, ...]) -> str:
    """Names, sizes and modification times of the knowledge base's tables and the validator's code."""
    parts = []
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            parts.append(directory + ": unreadable")
            continue
        for name in names:
            if name.endswith((".csv", ".py")):
                info = os.stat(os.path.join(directory, name))
                parts.append("%s/%s %d %d" % (directory, name, info.st_size, info.st_mtime_ns))
    return "\n".join(parts)


def _disk_cache_path(key: str) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    code = (here, os.path.join(os.path.dirname(here), "module_utils"))
    digest = hashlib.sha256((key + "\n" + _fingerprint((os.path.abspath(kb_dir()),) + code)).encode()).hexdigest()
    return os.path.join(tempfile.gettempdir(), "gpufleet-stack-%d" % os.getuid(), digest + ".json")


def _read_disk_cache(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as handle:
            outcome = json.load(handle)
    except (OSError, ValueError):
        return None
    return outcome if isinstance(outcome, dict) and set(outcome) == {"report", "resolved", "error"} else None


def _write_disk_cache(path: str, outcome: dict) -> None:
    """Written beside its name and renamed over it: a worker reading it never sees half a file."""
    partial = None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".partial")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(outcome, out)
        os.replace(partial, path)
    except (OSError, TypeError, ValueError):
        # A cache that cannot be written only costs the next worker the computation.
        if partial is not None and os.path.exists(partial):
            os.unlink(partial)


def validate_and_resolve(inputs: dict) -> dict:
    """{'report': the validator's report, 'resolved': what the stack installs or None, 'error': message or None}.
    Cached per process and on disk (the module's docstring says why): every role default of a play reads the same
    stack."""
    key = json.dumps(inputs, sort_keys=True, default=str)
    if key not in _CACHE:
        path = _disk_cache_path(key)
        outcome = _read_disk_cache(path)
        if outcome is None:
            outcome = _compute(inputs)
            _write_disk_cache(path, outcome)
        _CACHE[key] = outcome
    return _CACHE[key]


def _compute(inputs: dict) -> dict:
    # Imported on a cache miss only: a forked worker that finds the outcome on disk never pays for the validator's
    # modules (about 30 ms a worker, most of a drift task's share of the stack).
    from ansible_collections.gpufleet.fleet.plugins.module_utils import stack_spec
    from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_artifacts, stack_declared

    if inputs["stack"] is None:
        return {
            "report": None,
            "resolved": None,
            "error": "no gpufleet_stack is declared for this host: declare one per GPU class in the "
            "inventory's group_vars (see inventories/example)",
        }
    try:
        kb = stack_kb.load_kb(kb_dir())
        report = stack_declared.validate_stack(with_platform(stack_spec.normalize_stack(inputs["stack"]), inputs), kb)
    except (stack_spec.StackError, stack_kb.KnowledgeBaseError) as error:
        return {"report": None, "resolved": None, "error": "gpufleet_stack is invalid: %s" % error}
    if report["errors"]:
        return {
            "report": report,
            "resolved": None,
            "error": "the declared stack is not compatible (%d error(s)): %s"
            % (
                len(report["errors"]),
                " | ".join("[%s] %s" % (item["link"], item["message"]) for item in report["errors"]),
            ),
        }
    try:
        resolved = stack_artifacts.resolve(
            report["stack"],
            kb,
            inputs["mirror_url"],
            inputs["pins"],
            inputs["extra_toolkits"],
            inputs["venv_options"],
            inputs["pyenv_version"],
        )
    except stack_artifacts.ArtifactError as error:
        return {"report": report, "resolved": None, "error": "the declared stack cannot be installed: %s" % error}
    resolved["stack"] = report["stack"]
    return {"report": report, "resolved": resolved, "error": None}
