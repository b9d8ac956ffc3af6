# -*- coding: utf-8 -*-
"""Read-only comparisons of declared and actual host state, for drift runs (module drift_probe).

Shipped to targets with the drift_probe module: standard library, ansible.module_utils.urls and gpufleet's other module_utils only.

A drift layer sends a list of checks, each a dict with a `kind` and that kind's keys; every check reads the
host (files, links, the dpkg database, systemd, NVML, interpreters) and returns findings: one per value that
differs from the declared one, with the expected and the actual value. Nothing here writes to the host.
Kinds of the system (files, packages, accounts, services) live here; kinds of the GPU and Python stack
live in drift_stack.py. `run_checks` runs a whole layer.
"""

from __future__ import annotations

import difflib
import grp
import hashlib
import os
import pwd
import re
import stat
import subprocess
import urllib.error
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url
from ansible_collections.gpufleet.fleet.plugins.module_utils.digests import sha256_file

DPKG_STATUS = "/var/lib/dpkg/status"
# A diff longer than this is cut: the report shows where files differ, the host keeps the whole file.
DIFF_LINES = 40


class CheckError(Exception):
    """The state could not be read (not: it differs). The layer is then reported as an error."""


class SpecError(ValueError):
    """A check declared wrongly by the drift playbook: a bug in a layer file, not drift."""


@dataclass
class Finding:
    """One declared value that the host does not have."""

    check: str
    field: str
    expected: Any
    actual: Any
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "field": self.field,
            "expected": self.expected,
            "actual": self.actual,
            "detail": self.detail,
        }


Runner = Callable[[list], "tuple[int, str, str]"]


def run_process(argv: list) -> tuple[int, str, str]:
    """Runs a read-only command with a fixed locale; (rc, stdout, stderr). rc 127 when it does not exist."""
    try:
        process = subprocess.run(
            [str(part) for part in argv],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, LC_ALL="C", LANGUAGE="C"),
            check=False,
        )
    except FileNotFoundError as error:
        return 127, "", str(error)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer within 120 s"
    return process.returncode, process.stdout, process.stderr


@dataclass
class Context:
    """What checks share within one layer: how commands run, and values read once (dpkg database)."""

    run: Runner = run_process
    dpkg_status: str = DPKG_STATUS
    proc_sys: str = "/proc/sys"
    cache: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


# ---- helpers ----------------------------------------------------------------------------------------


def require(spec: dict, *keys: str) -> None:
    missing = [key for key in keys if spec.get(key) in (None, "")]
    if missing:
        raise SpecError(f"check {spec.get('kind')} needs {', '.join(missing)} (got {sorted(spec)})")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def short_hash(digest: str) -> str:
    return "sha256:" + digest[:16]


def text_diff(expected: bytes, actual: bytes, label: str) -> str:
    """A unified diff declared -> host, cut at DIFF_LINES; empty for binary content."""
    try:
        before, after = expected.decode("utf-8").splitlines(), actual.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return ""
    lines = list(difflib.unified_diff(before, after, f"{label} (declared)", f"{label} (host)", lineterm="", n=1))
    if len(lines) > DIFF_LINES:
        lines = lines[:DIFF_LINES] + [f"... {len(lines) - DIFF_LINES} more diff lines"]
    return "\n".join(lines)


def file_type(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "link")):
        if test(mode):
            return name
    return "special file"


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def metadata_findings(label: str, info: os.stat_result, spec: dict) -> list[Finding]:
    """Owner, group and mode when the check declares them."""
    found = []
    if spec.get("owner") and owner_name(info.st_uid) != str(spec["owner"]):
        found.append(Finding(label, "owner", str(spec["owner"]), owner_name(info.st_uid)))
    if spec.get("group") and group_name(info.st_gid) != str(spec["group"]):
        found.append(Finding(label, "group", str(spec["group"]), group_name(info.st_gid)))
    if spec.get("mode"):
        wanted = int(str(spec["mode"]), 8)
        if stat.S_IMODE(info.st_mode) != wanted:
            found.append(Finding(label, "mode", "%04o" % wanted, "%04o" % stat.S_IMODE(info.st_mode)))
    return found


def lstat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise CheckError(f"cannot read {path}: {error.strerror}") from None


# ---- kinds: files --------------------------------------------------------------------------------------


def check_file(spec: dict, ctx: Context) -> list[Finding]:
    """A regular file with the declared content (or sha256), owner, group and mode.

    `content` is the declared text (a role's template rendered on the controller); `show_diff: false` keeps
    the content of secret files out of the report, which then shows digests only.
    """
    require(spec, "path")
    path, label = spec["path"], f"file {spec['path']}"
    info = lstat_or_none(path)
    if info is None:
        return [Finding(label, "exists", "present", "absent")]
    if not stat.S_ISREG(info.st_mode):
        return [Finding(label, "type", "regular file", file_type(info.st_mode))]
    found = metadata_findings(label, info, spec)
    try:
        if spec.get("content") is not None:
            expected = str(spec["content"]).encode("utf-8")
            with open(path, "rb") as handle:
                actual = handle.read()
            if actual != expected:
                detail = text_diff(expected, actual, path) if spec.get("show_diff", True) else ""
                found.append(
                    Finding(
                        label, "content", short_hash(sha256_bytes(expected)), short_hash(sha256_bytes(actual)), detail
                    )
                )
        elif spec.get("sha256"):
            actual_digest = sha256_file(path)
            if actual_digest != str(spec["sha256"]).lower():
                found.append(
                    Finding(label, "content", short_hash(str(spec["sha256"]).lower()), short_hash(actual_digest))
                )
    except OSError as error:
        raise CheckError(f"cannot read {path}: {error.strerror}") from None
    return found


def check_directory(spec: dict, ctx: Context) -> list[Finding]:
    """A directory with the declared owner, group and mode."""
    require(spec, "path")
    path, label = spec["path"], f"directory {spec['path']}"
    info = lstat_or_none(path)
    if info is None:
        return [Finding(label, "exists", "present", "absent")]
    if not stat.S_ISDIR(info.st_mode):
        return [Finding(label, "type", "directory", file_type(info.st_mode))]
    return metadata_findings(label, info, spec)


def check_link(spec: dict, ctx: Context) -> list[Finding]:
    """A symbolic link pointing at the declared target (as written, like the file module writes it)."""
    require(spec, "path", "target")
    path, label = spec["path"], f"link {spec['path']}"
    info = lstat_or_none(path)
    if info is None:
        return [Finding(label, "target", spec["target"], "absent")]
    if not stat.S_ISLNK(info.st_mode):
        return [Finding(label, "target", spec["target"], f"a {file_type(info.st_mode)}, not a link")]
    target = os.readlink(path)
    if target.rstrip("/") != str(spec["target"]).rstrip("/"):
        return [Finding(label, "target", spec["target"], target)]
    return []


def check_absent(spec: dict, ctx: Context) -> list[Finding]:
    """A path that must not exist."""
    require(spec, "path")
    info = lstat_or_none(spec["path"])
    if info is None:
        return []
    return [Finding(f"path {spec['path']}", "exists", "absent", file_type(info.st_mode))]


# ---- kinds: packages, accounts, services -----------------------------------------------------------


def dpkg_packages(ctx: Context) -> dict[str, str]:
    """{package name: Status field} from the dpkg database, read once per layer."""
    if "dpkg" not in ctx.cache:
        try:
            with open(ctx.dpkg_status, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except FileNotFoundError:
            raise CheckError(f"{ctx.dpkg_status} does not exist: package checks support the Debian family") from None
        packages: dict[str, str] = {}
        for stanza in text.split("\n\n"):
            name = re.search(r"^Package: (\S+)", stanza, re.MULTILINE)
            status = re.search(r"^Status: (.+)$", stanza, re.MULTILINE)
            if not (name and status):
                continue
            # A multi-arch package has a stanza per architecture: the installed one wins.
            if name.group(1) not in packages or status.group(1).strip().endswith(" installed"):
                packages[name.group(1)] = status.group(1).strip()
        ctx.cache["dpkg"] = packages
    return ctx.cache["dpkg"]


def check_packages(spec: dict, ctx: Context) -> list[Finding]:
    """Debian packages installed; `held: true` also wants them held (dpkg selection hold)."""
    require(spec, "names")
    packages = dpkg_packages(ctx)
    found = []
    for name in spec["names"]:
        status = packages.get(name, "")
        if not status.endswith(" installed"):
            found.append(Finding(f"package {name}", "installed", "installed", status or "not installed"))
        elif spec.get("held") and not status.startswith("hold "):
            found.append(Finding(f"package {name}", "selection", "hold", status.split()[0]))
    return found


def check_held(spec: dict, ctx: Context) -> list[Finding]:
    """Every installed package whose name matches `pattern` is held (kernel packages under a driver)."""
    require(spec, "pattern")
    pattern = re.compile(spec["pattern"])
    return [
        Finding(f"package {name}", "selection", "hold", status.split()[0])
        for name, status in sorted(dpkg_packages(ctx).items())
        if pattern.search(name) and status.endswith(" installed") and not status.startswith("hold ")
    ]


def check_user(spec: dict, ctx: Context) -> list[Finding]:
    """An account with the declared primary group, home and shell."""
    require(spec, "name")
    label = f"user {spec['name']}"
    try:
        account = pwd.getpwnam(spec["name"])
    except KeyError:
        return [Finding(label, "exists", "present", "absent")]
    found = []
    if spec.get("group") and group_name(account.pw_gid) != spec["group"]:
        found.append(Finding(label, "group", spec["group"], group_name(account.pw_gid)))
    if spec.get("home") and account.pw_dir != spec["home"]:
        found.append(Finding(label, "home", spec["home"], account.pw_dir))
    if spec.get("shell") and account.pw_shell != spec["shell"]:
        found.append(Finding(label, "shell", spec["shell"], account.pw_shell))
    return found


SYSTEMD_PROPERTIES = ("LoadState", "ActiveState", "SubState", "NeedDaemonReload", "DropInPaths")
# `systemctl is-enabled` answers with rc 0 for these too, but ansible's systemd_service (what provisioning
# runs) enables such a unit again: drift calls them not enabled, so that it agrees with the next provision.
NOT_ENABLED_FOR_ANSIBLE = ("enabled-runtime", "indirect", "alias")


def unit_properties(name: str, ctx: Context) -> dict[str, str]:
    unit = name if "." in name else f"{name}.service"
    rc, out, err = ctx.run(["systemctl", "show", unit, "--property=" + ",".join(SYSTEMD_PROPERTIES)])
    if rc != 0:
        raise CheckError(f"systemctl show {unit} failed (exit {rc}): {(err or out).strip()[-200:]}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def unit_enabled(unit: str, ctx: Context) -> tuple[bool, str]:
    """(enabled, state) as systemd resolves it for this unit (an instance of a template too)."""
    rc, out, dummy = ctx.run(["systemctl", "is-enabled", unit])
    state = out.strip().splitlines()[0] if out.strip() else "unknown"
    return rc == 0 and state not in NOT_ENABLED_FOR_ANSIBLE, state


def check_service(spec: dict, ctx: Context) -> list[Finding]:
    """A systemd unit enabled and/or active as declared, loaded from its current unit files.

    `dropins`: the drop-ins systemd must load for it and no other (a foreign one, of the unit or of its
    template, `vllm@.service.d/`, changes the service as much as an edited unit does).
    """
    require(spec, "name")
    unit = spec["name"] if "." in spec["name"] else f"{spec['name']}.service"
    label = f"service {spec['name']}"
    props = unit_properties(unit, ctx)
    if props.get("LoadState") == "not-found":
        return [Finding(label, "unit", "installed", "not found")]
    found = []
    if spec.get("enabled") is not None:
        enabled, state = unit_enabled(unit, ctx)
        if enabled != bool(spec["enabled"]):
            found.append(Finding(label, "enabled", bool(spec["enabled"]), state))
    if spec.get("active") is not None:
        active = props.get("ActiveState") == "active"
        if active != bool(spec["active"]):
            state = f"{props.get('ActiveState', 'unknown')} ({props.get('SubState', '?')})"
            found.append(Finding(label, "active", "active" if spec["active"] else "inactive", state))
    if spec.get("dropins") is not None:
        loaded = sorted(props.get("DropInPaths", "").split())
        if loaded != sorted(spec["dropins"]):
            foreign = sorted(set(loaded) - set(spec["dropins"]))
            found.append(
                Finding(
                    label,
                    "drop-ins",
                    sorted(spec["dropins"]),
                    loaded,
                    f"not gpufleet's: {', '.join(foreign)}" if foreign else "",
                )
            )
    if props.get("NeedDaemonReload") == "yes":
        found.append(
            Finding(
                label,
                "loaded unit",
                "the unit file on disk",
                "an older unit file (changed on disk, systemd not reloaded)",
            )
        )
    return found


def check_sysctl(spec: dict, ctx: Context) -> list[Finding]:
    """Kernel settings in effect (/proc/sys) as declared, where the node can apply them.

    A container's /proc/sys is read-only (systemd-sysctl skips itself there): noted, not drift.
    """
    require(spec, "settings")
    if not os.access(ctx.proc_sys, os.W_OK) or os.statvfs(ctx.proc_sys).f_flag & os.ST_RDONLY:
        ctx.notes.append(f"{ctx.proc_sys} is read-only here (a container): kernel settings in effect not compared")
        return []
    found = []
    for key, wanted in sorted(spec["settings"].items()):
        path = os.path.join(ctx.proc_sys, *str(key).split("."))
        try:
            with open(path, encoding="utf-8") as handle:
                actual = " ".join(handle.read().split())
        except FileNotFoundError:
            found.append(Finding(f"sysctl {key}", "value", str(wanted), "no such setting"))
            continue
        except OSError as error:
            raise CheckError(f"cannot read {path}: {error.strerror}") from None
        if actual != " ".join(str(wanted).split()):
            found.append(Finding(f"sysctl {key}", "value", str(wanted), actual))
    return found


def check_http(spec: dict, ctx: Context) -> list[Finding]:
    """An HTTP endpoint answering with the declared status (a health check); GET only.

    `validate_certs: false` accepts any certificate: for a node's own TLS endpoint reached on loopback, whose
    certificate names the node.
    """
    require(spec, "url")
    wanted = int(spec.get("status", 200))
    label = f"endpoint {spec['url']}"
    validate_certs = spec.get("validate_certs", True) not in (False, "false", "False")
    try:
        # No ~/.netrc credentials: the check sends exactly the headers it declares.
        with open_url(
            spec["url"],
            method="GET",
            headers=spec.get("headers") or {},
            validate_certs=validate_certs,
            timeout=float(spec.get("timeout", 10)),
            use_netrc=False,
        ) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (urllib.error.URLError, OSError, UrlsConnectionError) as error:
        return [Finding(label, "status", wanted, f"no answer ({getattr(error, 'reason', error)})")]
    return [] if status == wanted else [Finding(label, "status", wanted, status)]


# ---- running a layer ----------------------------------------------------------------------------------

Check = Callable[[dict, Context], "list[Finding]"]
KINDS: dict[str, Check] = {
    "file": check_file,
    "directory": check_directory,
    "link": check_link,
    "absent": check_absent,
    "packages": check_packages,
    "held": check_held,
    "user": check_user,
    "service": check_service,
    "sysctl": check_sysctl,
    "http": check_http,
}


def register(kinds: Mapping[str, Check]) -> None:
    """Adds kinds defined elsewhere (drift_stack.py): one registry, so a layer file can use any kind."""
    KINDS.update(kinds)


def validate(checks: list) -> list[dict]:
    """The checks that apply (`applies: false` drops one), each with a known kind; SpecError otherwise."""
    valid = []
    for index, spec in enumerate(checks):
        if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
            kind = spec.get("kind") if isinstance(spec, dict) else type(spec).__name__
            raise SpecError(f"check {index}: unknown kind {kind!r}; known kinds: {', '.join(sorted(KINDS))}")
        if spec.get("applies", True) in (False, "false", "False"):
            continue
        valid.append(spec)
    return valid


def run_checks(checks: list[dict], ctx: Context) -> dict[str, Any]:
    """Runs every check; a check that cannot read its state is an error, and the others still run."""
    findings: list[dict] = []
    errors: list[dict] = []
    for spec in checks:
        try:
            findings.extend(item.as_dict() for item in KINDS[spec["kind"]](spec, ctx))
        except CheckError as error:
            errors.append({"check": spec["kind"], "message": str(error)})
    # Drift found is reported as drift even when another check could not read its state (listed in errors).
    if findings:
        status = "drifted"
    elif errors:
        status = "error"
    else:
        status = "ok"
    return {"status": status, "drift": findings, "errors": errors, "checked": len(checks), "notes": ctx.notes}
