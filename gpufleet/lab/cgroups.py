"""A cgroup of its own for each lab host's systemd-nspawn, in the unified (cgroup2) hierarchy.

nspawn splits the cgroup it starts in into payload/ (the container) and supervisor/ (itself). Every host's nspawn
started in the same cgroup, so the hosts shared one payload/ and their systemd managers one tree of unit cgroups:
each saw the others' processes in its units (as pid 0, outside its PID namespace), and a stop of vllm@main on one
host waited for another host's vllm@main to end ("Processes still around after final SIGKILL", systemd 257).
"""

from __future__ import annotations

from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
OWN_CGROUPS = Path("/proc/self/cgroup")


def unified_mount(mountinfo: str) -> Path | None:
    """Where the cgroup2 hierarchy is mounted, from /proc/self/mountinfo's text (fstype follows " - ")."""
    for line in mountinfo.splitlines():
        fields, separator, rest = line.partition(" - ")
        if separator and rest.split(" ", 1)[0] == "cgroup2":
            return Path(fields.split()[4])
    return None


def unified_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup in the unified hierarchy, from /proc/self/cgroup's text (its "0::PATH" line)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[len("0::") :]
    return None


def host_cgroup(name: str) -> Path | None:
    """The cgroup a host's nspawn runs in: gpufleet-lab-NAME under this process's own, or None without cgroup2."""
    mount = unified_mount(MOUNTINFO.read_text())
    own = unified_cgroup(OWN_CGROUPS.read_text())
    if mount is None or own is None:
        return None
    return mount / own.lstrip("/") / f"gpufleet-lab-{name}"


def enter(cgroup: Path) -> None:
    """Moves the calling process into the cgroup: nspawn's child calls it before nspawn runs."""
    (cgroup / "cgroup.procs").write_text("0")


def remove(cgroup: Path) -> None:
    """Removes the cgroup and the empty ones nspawn and the container left in it, deepest first."""
    nested = sorted((path for path in cgroup.rglob("*") if path.is_dir()), key=lambda path: len(path.parts))
    for path in [*reversed(nested), cgroup]:
        try:
            path.rmdir()
        except OSError:
            # Still holding processes, or not a cgroup: left as it is.
            pass
