"""Runs gpufleet's playbooks through ansible-runner and summarises the result per host."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet import PROJECT_ROOT, run_document
from gpufleet.ansible_options import current_options, settings_environment
from gpufleet.collection import collections_dir
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.locks import LEASED_PLAYBOOKS, current_operation

STAT_KEYS = ("ok", "changed", "failures", "unreachable", "skipped", "rescued", "ignored")
# What of the operator's environment a playbook run gets (ansible-runner writes the whole of it into every run's
# record, artifacts/<ident>/command): Ansible's and gpufleet's settings, the SSH agent, locale, proxies. Not
# HF_TOKEN, cloud keys or anything else exported in the shell. GPUFLEET_RUN_ENVIRONMENT adds names (spaces).
ALLOWED_ENVIRONMENT = (
    r"PATH|HOME|USER|LOGNAME|SHELL|TERM|TZ|TMPDIR|LANG|LANGUAGE|LC_[A-Z]+|SSH_AUTH_SOCK|VIRTUAL_ENV|NO_COLOR|"
    r"ANSIBLE_[A-Z0-9_]+|GPUFLEET_[A-Z0-9_]+|(?:http|https|no)_proxy|(?:HTTP|HTTPS|NO)_PROXY|PYTHONPATH"
)
# How many runs' records runs_dir() keeps (GPUFLEET_KEEP_RUNS): the oldest beyond go after each run.
DEFAULT_KEEP_RUNS = 200
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}-")
# Ansible colours its output in a run's stdout record, even where no terminal reads it.
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def runs_dir() -> Path:
    """Where each run's artifacts (events, stdout, stats) are kept, one directory per run."""
    return Path(os.environ.get("GPUFLEET_RUNS_DIR", "/var/lib/gpufleet/runs"))


def make_run_dir(path: Path) -> Path:
    """Creates a run's directory; GpufleetError naming the directory and the fix when it cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise GpufleetError(_unwritable(path, error.strerror or str(error))) from error
    if not os.access(path, os.W_OK | os.X_OK):
        raise GpufleetError(_unwritable(path, "permission denied"))
    return path


def run_environment(environ: dict[str, str]) -> dict[str, str]:
    """The allow-listed part of environ (ALLOWED_ENVIRONMENT and the names GPUFLEET_RUN_ENVIRONMENT lists)."""
    extra = set(environ.get("GPUFLEET_RUN_ENVIRONMENT", "").split())
    return {name: value for name, value in environ.items() if re.fullmatch(ALLOWED_ENVIRONMENT, name) or name in extra}


@contextmanager
def only_environment(environment: dict[str, str]) -> Iterator[None]:
    """os.environ is `environment` inside the block: ansible-runner seeds a run's environment (and its record)
    with a copy of os.environ."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environment)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def prune_runs(root: Path, keep: int) -> list[Path]:
    """Removes the oldest run directories of root beyond `keep` (by their time-stamped names); what it removed."""
    runs = sorted(path for path in root.iterdir() if path.is_dir() and RUN_ID.match(path.name)) if root.is_dir() else []
    removed = runs[: max(len(runs) - keep, 0)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def keep_runs() -> int:
    text = os.environ.get("GPUFLEET_KEEP_RUNS", str(DEFAULT_KEEP_RUNS))
    if not text.isdigit() or int(text) < 1:
        raise GpufleetError(f"GPUFLEET_KEEP_RUNS={text!r}: give how many runs' records to keep, a number >= 1")
    return int(text)


def _unwritable(path: Path, why: str) -> str:
    return (
        f"cannot keep the run's records in {path} ({why}): run as a user who can write there, or set "
        "GPUFLEET_RUNS_DIR to a directory you can write"
    )


def ensure_ansible_on_path() -> None:
    """ansible-runner starts `ansible-playbook` from PATH: use the one installed beside this gpufleet, also
    when its environment is not activated (.venv/bin/gpufleet called by path)."""
    here = str(Path(sys.executable).parent)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([here, os.environ.get("PATH", "")])


@dataclass
class PlaybookResult:
    """What a playbook run did: its exit status, per-host counters and where its artifacts are."""

    rc: int
    status: str
    artifacts: Path
    hosts: dict[str, dict[str, int]] = field(default_factory=dict)
    # "host: task: first line of its message" of each failure that was not ignored (a rescued one included), in
    # order; read only when the run failed.
    failures: list[str] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return sum(counts["changed"] for counts in self.hosts.values())

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, c in self.hosts.items() if c["failures"] or c["unreachable"])

    def to_dict(self) -> dict:
        """The run as `--json` reports it (gpufleet/run_document.py)."""
        return {
            "rc": self.rc,
            "status": self.status,
            "changed": self.changed,
            "failed_hosts": self.failed_hosts,
            "hosts": self.hosts,
            "failures": self.failures,
            "artifacts": str(self.artifacts),
        }


def host_counters(stats: dict | None) -> dict[str, dict[str, int]]:
    """Turns ansible's final stats ({"ok": {"host": n}, ...}) into {"host": {"ok": n, ...}}. ansible-runner
    calls the unreachable hosts `dark`."""
    stats = dict(stats or {})
    if "dark" in stats:
        stats["unreachable"] = stats["dark"]
    hosts = sorted({host for key in STAT_KEYS for host in (stats.get(key) or {})})
    return {host: {key: int((stats.get(key) or {}).get(host, 0)) for key in STAT_KEYS} for host in hosts}


# Linux refuses one argument longer than 128 KiB (MAX_ARG_STRLEN: E2BIG, "Argument list too long"); a --limit of
# about 4,000 host names joined with commas is one. Longer limits go in a file, which Ansible reads as --limit @FILE.
LIMIT_INLINE_MAX = 16 * 1024


def limit_argument(limit: str | None, run_dir: Path) -> str | None:
    """LIMIT as ansible-playbook takes it: inline, or, when long, @FILE in RUN_DIR with one pattern a line."""
    if limit is None or len(limit) <= LIMIT_INLINE_MAX:
        return limit
    path = run_dir / "limit"
    path.write_text("".join(pattern + "\n" for pattern in limit.split(",") if pattern))
    return f"@{path}"


def run_playbook(
    playbook: str,
    inventory: Path,
    *,
    limit: str | None = None,
    tags: str | None = None,
    skip_tags: str | None = None,
    check: bool = False,
    diff: bool = False,
    extravars: dict | None = None,
    quiet: bool = False,
    run_id: str | None = None,
    envvars: dict[str, str] | None = None,
    event_handler: Callable[[dict], bool] | None = None,
    runs_root: Path | None = None,
) -> PlaybookResult:
    """Runs playbooks/<playbook> against `inventory`; the caller decides what a failure means.

    The run's directory is runs_root (default runs_dir())/run_id (default: time, pid and the playbook's name);
    envvars are added to the run's environment and event_handler sees each event as it happens
    (ansible-runner's own).
    """
    import ansible_runner  # imported here so `gpufleet --help` stays fast

    playbook_path = PROJECT_ROOT / "playbooks" / playbook
    if not playbook_path.is_file():
        raise GpufleetError(f"playbook {playbook_path} does not exist")
    if not inventory.exists():
        raise GpufleetError(f"inventory {inventory} does not exist (for the lab, run `gpufleet lab up` first)")
    ensure_ansible_on_path()
    run_id = run_id or time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}-{playbook.removesuffix('.yml')}"
    private_dir = make_run_dir((runs_root or runs_dir()) / run_id)
    options = current_options()
    cmdline = " ".join([options.cmdline_text(), *(flag for flag, on in (("--check", check), ("--diff", diff)) if on)])
    # The running operation's lease goes to every playbook that takes one (playbooks/lease.yml).
    operation = current_operation()
    if operation and playbook in LEASED_PLAYBOOKS:
        extravars = {**operation.extravars(), **(extravars or {})}
    keep = keep_runs()
    environment = run_environment(dict(os.environ))
    with only_environment(environment):
        runner = ansible_runner.run(
            private_data_dir=str(private_dir),
            project_dir=str(PROJECT_ROOT),
            playbook=str(playbook_path),
            inventory=str(inventory.absolute()),  # not resolve(): group_vars sit beside a linked file
            limit=limit_argument(limit, private_dir),
            tags=tags,
            skip_tags=skip_tags,
            cmdline=cmdline.strip() or None,
            # The operator's inline -e values, under gpufleet's own (ansible_options).
            extravars={**options.inline_vars, **(extravars or {})},
            envvars={
                **settings_environment(environment, Path.cwd(), collections_dir()),
                # An inventory Ansible cannot parse at all is an error, never a run of no host.
                "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
                **no_colour_unless_a_terminal(environment),
                **(envvars or {}),
            },
            passwords=options.passwords() or None,
            quiet=quiet,
            event_handler=event_handler,
        )
    if operation and playbook in LEASED_PLAYBOOKS and int(runner.rc) != 0:
        operation.failed_limits.append(limit)
    prune_runs(private_dir.parent, keep)
    result = PlaybookResult(
        rc=int(runner.rc),
        status=str(runner.status),
        artifacts=private_dir / "artifacts" / runner.config.ident,
        hosts=host_counters(runner.stats),
        failures=failure_lines(runner.events) if int(runner.rc) != 0 else [],
    )
    run_document.record_run({"playbook": playbook, **result.to_dict()})
    return result


def no_colour_unless_a_terminal(environment: dict[str, str]) -> dict[str, str]:
    """Ansible's colours only where a terminal shows them (its own -v output piped to a file or a CI log has
    none), unless the operator chose (ANSIBLE_NOCOLOR, ANSIBLE_FORCE_COLOR, NO_COLOR)."""
    chosen = {"ANSIBLE_NOCOLOR", "ANSIBLE_FORCE_COLOR", "NO_COLOR"} & set(environment)
    return {} if chosen or sys.stdout.isatty() else {"ANSIBLE_NOCOLOR": "1"}


def failure_lines(events: Iterable[dict]) -> list[str]:
    """One line per failed or unreachable task of a run's events (not those ignored)."""
    lines = []
    for event in events:
        data = event.get("event_data") or {}
        if event.get("event") not in ("runner_on_failed", "runner_on_unreachable") or data.get("ignore_errors"):
            continue
        message = str((data.get("res") or {}).get("msg") or "failed").strip().splitlines() or ["failed"]
        lines.append(f"{data.get('host')}: {data.get('task')}: {message[0][:400]}")
    return lines


# The fix for the errors operators meet first, by words of Ansible's message.
ERROR_HINTS = (
    (
        "no vault secrets",
        "give the vault password with --vault-password-file FILE or --ask-vault-pass (or ANSIBLE_VAULT_PASSWORD_FILE)",
    ),
    ("Decryption failed", "the vault password given is not the inventory's; give the right one"),
    ("No inventory was parsed", "the inventory does not parse; `ansible-inventory -i INVENTORY --graph` says why"),
)


def first_error(result: PlaybookResult) -> str:
    """The first ERROR line Ansible printed in the run (a vault password missing, a playbook it cannot load),
    with the fix where ERROR_HINTS knows it."""
    stdout = result.artifacts / "stdout"
    text = ANSI_COLOUR.sub("", stdout.read_text(errors="replace")) if stdout.is_file() else ""
    lines = [line.strip() for line in text.splitlines() if line.lstrip().startswith(("ERROR!", "[ERROR]"))]
    return with_hint(lines[0]) if lines else ""


def with_hint(error: str) -> str:
    """Ansible's error with its fix, where ERROR_HINTS knows it."""
    fixes = [fix for words, fix in ERROR_HINTS if words in error]
    return f"{error}: {fixes[0]}" if fixes else error


def require_hosts(result: PlaybookResult, inventory: Path, limit: str | None) -> None:
    """A run that reached no host did nothing: say why, never "successful" (an inventory that does not parse,
    no gpu_nodes group, a --limit that matches nothing, a vault password missing)."""
    if result.hosts:
        return
    error = first_error(result)
    if error:
        raise UsageError(f"the run stopped before any host: {error} (run records in {result.artifacts})")
    matching = f" matching --limit {limit}" if limit else ""
    raise UsageError(
        f"the run reached no host: {inventory} has no host in group gpu_nodes{matching}, or does not parse; "
        f"see what Ansible reads with `ansible-inventory -i {inventory} --graph`"
    )


def host_table(hosts: dict[str, dict[str, int]]) -> list[str]:
    """A per-host table: ok / changed / failed / unreachable / skipped."""
    lines = [f"{'host':<20} {'ok':>4} {'changed':>8} {'failed':>7} {'unreachable':>12} {'skipped':>8}"]
    for host, counts in hosts.items():
        lines.append(
            f"{host:<20} {counts['ok']:>4} {counts['changed']:>8} {counts['failures']:>7} "
            f"{counts['unreachable']:>12} {counts['skipped']:>8}"
        )
    return lines


def format_summary(result: PlaybookResult) -> str:
    """The run's per-host table and its outcome."""
    lines = host_table(result.hosts)
    lines.append(f"run {result.status} (rc {result.rc}); artifacts in {result.artifacts}")
    return "\n".join(lines)
