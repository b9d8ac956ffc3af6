"""Each lab host's nspawn in a cgroup of its own: the parsers of /proc's files, and a supervised child moved for real.

The integration side (tests/integration/test_lab_fleet.py): no lab host sees another host's processes in its
cgroups, which every host did while all nspawns shared one payload/ cgroup.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpufleet.lab import cgroups
from gpufleet.lab.supervisor import Supervisor

# /proc/self/mountinfo of a hybrid host (this machine kind: v1 controllers, cgroup2 at .../unified) and of a
# unified-only one; only the cgroup lines and one other.
HYBRID_MOUNTINFO = """\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
35 25 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
37 35 0:32 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,name=systemd
"""
UNIFIED_MOUNTINFO = """\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
35 25 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""
HYBRID_CGROUP = "9:name=systemd:/\n4:memory:/process_api/460f383c\n1:cpu:/\n0::/\n"
UNIFIED_CGROUP = "0::/user.slice/user-0.slice/session-3.scope\n"


def test_the_unified_mount_is_found_on_hybrid_and_unified_hosts() -> None:
    assert cgroups.unified_mount(HYBRID_MOUNTINFO) == Path("/sys/fs/cgroup/unified")
    assert cgroups.unified_mount(UNIFIED_MOUNTINFO) == Path("/sys/fs/cgroup")
    assert cgroups.unified_mount(HYBRID_MOUNTINFO.replace("cgroup2 cgroup2", "tmpfs tmpfs")) is None


def test_the_own_cgroup_is_the_unified_line() -> None:
    assert cgroups.unified_cgroup(HYBRID_CGROUP) == "/"
    assert cgroups.unified_cgroup(UNIFIED_CGROUP) == "/user.slice/user-0.slice/session-3.scope"
    assert cgroups.unified_cgroup("9:name=systemd:/\n") is None


def writable_test_cgroup() -> Path:
    cgroup = cgroups.host_cgroup(f"unit-test-{os.getpid()}")
    if cgroup is None or os.geteuid() != 0 or not os.access(cgroup.parent, os.W_OK):
        pytest.skip("needs root and a writable cgroup2 hierarchy (as the lab does)")
    return cgroup


def test_the_supervised_child_runs_in_the_hosts_cgroup_which_goes_when_it_stops(tmp_path: Path) -> None:
    cgroup = writable_test_cgroup()
    own = cgroups.unified_cgroup(cgroups.OWN_CGROUPS.read_text())
    assert own is not None
    # In nspawn's place: a child that reports its cgroup, makes one below it (as nspawn makes payload/) and exits.
    child = [
        sys.executable,
        "-c",
        "import pathlib; print(pathlib.Path('/proc/self/cgroup').read_text().splitlines()[-1]); "
        f"(pathlib.Path({str(cgroup)!r}) / 'payload').mkdir()",
    ]
    assert Supervisor("t-1", tmp_path, child, cgroup).run() == 0
    assert (tmp_path / "console.log").read_text().strip() == f"0::{own.rstrip('/')}/{cgroup.name}"
    assert f"in {cgroup}" in (tmp_path / "supervisor.log").read_text()
    assert not cgroup.exists()
    # Only the child moved: the supervisor stays where it was started.
    assert cgroups.unified_cgroup(cgroups.OWN_CGROUPS.read_text()) == own
