"""Lab state handling: state file, command lock, pid records, nspawn locks, host traces, rootfs recipe."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.errors import GpufleetError
from gpufleet.lab import fleet, locks, procs, rootfs, state
from gpufleet.lab.config import LabConfig
from gpufleet.lab.releases import RELEASES

BOOKWORM = RELEASES["debian12"]


@pytest.fixture
def config(tmp_path: Path) -> LabConfig:
    # A prefix no real lab uses, so namespaces and links on this machine never match.
    return LabConfig(
        cache_dir=tmp_path / "cache", lab_dir=tmp_path / "lab", prefix="zzunit", inventory_path=tmp_path / "hosts.yml"
    )


def test_state_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert state.load(path) == {}
    state.save(path, {"pool": "10.213.7.0/24", "prefix": "lab"})
    assert state.load(path) == {"pool": "10.213.7.0/24", "prefix": "lab"}


def test_torn_state_file_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"pool": "10.2')
    assert state.load(path) == {}


def test_second_lab_command_waits_then_gives_up(tmp_path: Path) -> None:
    lock_file = tmp_path / "lab.lock"
    with state.locked(lock_file):
        started = time.monotonic()
        with pytest.raises(GpufleetError, match="another `gpufleet lab` command"):
            with state.locked(lock_file, wait_seconds=0.6):
                pass
        assert time.monotonic() - started >= 0.5
    with state.locked(lock_file, wait_seconds=0):
        pass


def test_lock_is_retaken_when_its_file_was_deleted(tmp_path: Path) -> None:
    lock_file = tmp_path / "lab.lock"
    with state.locked(lock_file):
        lock_file.unlink()  # what `lab down` does at its end
        # A newcomer creates a fresh file and must get it, not wait on the deleted one.
        with state.locked(lock_file, wait_seconds=0):
            assert lock_file.exists()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    # Popen returns once exec has begun, before the kernel has published the new argv in /proc: wait until
    # the child runs its own code, which it can only do after exec finished.
    code = "import time; print('ready', flush=True); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code, "gpufleet-unit-marker"], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    yield process
    process.kill()
    process.wait()


def test_pid_record_tracks_a_live_process(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    pid_file = tmp_path / "x.pid"
    record = procs.write_pid_file(pid_file, sleeper.pid)
    assert record is not None and procs.read_pid_file(pid_file) == record
    assert procs.is_alive(record)
    sleeper.kill()
    sleeper.wait()
    assert not procs.is_alive(record)


def test_two_writers_of_one_pid_file_do_not_take_each_others_temporary_file(tmp_path: Path) -> None:
    # `lab up` records the mirror server it started while the server records itself in the same file (seen:
    # one writer's rename took the other's temporary file, FileNotFoundError, and `gpufleet demo` failed).
    pid_file = tmp_path / "mirror.pid"
    code = (
        "import os, sys; from pathlib import Path; from gpufleet.lab import procs\n"
        "for _ in range(300): procs.write_pid_file(Path(sys.argv[1]), os.getpid())"
    )
    writers = [subprocess.Popen([sys.executable, "-c", code, str(pid_file)], stderr=subprocess.PIPE) for _ in range(2)]
    errors = [writer.communicate()[1].decode() for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], errors
    record = procs.read_pid_file(pid_file)
    assert record is not None and record.pid in {writer.pid for writer in writers}
    assert [path.name for path in tmp_path.iterdir()] == ["mirror.pid"]


def test_recycled_pid_is_not_ours(sleeper: subprocess.Popen[bytes]) -> None:
    record = procs.record_for(sleeper.pid)
    assert record is not None
    assert not procs.is_alive(procs.PidRecord(record.pid, record.start_time + 1))


def test_unreadable_pid_file_means_no_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "x.pid"
    assert procs.read_pid_file(pid_file) is None
    pid_file.write_text("12")
    assert procs.read_pid_file(pid_file) is None


def test_orphans_are_found_by_exact_argument(sleeper: subprocess.Popen[bytes]) -> None:
    found = procs.pids_with_argument({"gpufleet-unit-marker"})
    assert [record.pid for record in found] == [sleeper.pid]
    assert procs.pids_with_argument({"gpufleet-unit-mark"}) == []


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = f"import signal,time,pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code])
    while not ready.exists():
        time.sleep(0.05)
    record = procs.record_for(process.pid)
    assert record is not None
    started = time.monotonic()
    # stop_processes only polls /proc: reap the zombie in the background, as init would for a detached one.
    reaper = threading.Thread(target=process.wait)
    reaper.start()
    assert procs.stop_processes([record], grace=0.5) == []
    reaper.join()
    assert process.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 10


def test_lock_on_file_is_seen_and_released(tmp_path: Path) -> None:
    lock_file = tmp_path / ".#rootfs.lck"
    with lock_file.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        assert locks.is_locked(lock_file)
        assert locks.wait_released([lock_file], 0.3) == [lock_file]
        assert locks.remove_released([lock_file]) == []
    assert not locks.is_locked(lock_file)
    assert locks.remove_released([lock_file]) == [lock_file]
    assert not lock_file.exists()


def test_ofd_lock_as_systemd_takes_it_is_seen(tmp_path: Path) -> None:
    lock_file = tmp_path / "inode-lock"
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT)
    try:
        # struct flock: l_type F_WRLCK, whence SEEK_SET, start 0, len 0 (whole file), pid 0 (required for OFD).
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
        assert locks.is_locked(lock_file)
    finally:
        os.close(fd)
    assert not locks.is_locked(lock_file)


def test_nspawn_lock_files_of_a_directory(tmp_path: Path) -> None:
    rootfs_dir = tmp_path / "rootfs"
    rootfs_dir.mkdir()
    files = locks.lock_files_for(rootfs_dir)
    stat = rootfs_dir.stat()
    assert files == [tmp_path / ".#rootfs.lck", locks.NSPAWN_LOCK_DIR / f"inode-{stat.st_dev}:{stat.st_ino}"]


def test_host_traces_are_found_from_directories(config: LabConfig) -> None:
    for name in ("zzunit-1", "zzunit-12", "zzunit-x", "other-3"):
        (config.hosts_dir / name).mkdir(parents=True)
    assert fleet.existing_indexes(config) == {1, 12}


def test_host_index_parsing(config: LabConfig) -> None:
    assert config.host_index("zzunit-7") == 7
    assert config.host_index("zzunit-07") is None
    assert config.host_index("zzunit-7x") is None
    assert config.host_index("zzunitx-7") is None


def test_rootfs_recipe_hash_is_stable_and_content_keyed() -> None:
    first = rootfs.recipe(BOOKWORM)
    assert rootfs.recipe_hash(first) == rootfs.recipe_hash(rootfs.recipe(BOOKWORM))
    changed = dict(first, packages=first["packages"] + ["jq"])
    assert rootfs.recipe_hash(changed) != rootfs.recipe_hash(first)
    assert rootfs.cached_tar(Path("/c"), BOOKWORM) == Path(f"/c/{rootfs.image_hash(BOOKWORM)}.tar")


def test_each_release_has_its_own_recipe_and_cache_entry() -> None:
    trixie = RELEASES["debian13"]
    # Bookworm's recipe for trixie, plus the hook that keeps the unrun kernel's image out of /boot.
    bookworm = rootfs.recipe(BOOKWORM)
    assert rootfs.recipe(trixie) == dict(
        bookworm,
        suite="trixie",
        customize_hooks=bookworm["customize_hooks"] + [rootfs.unrun_kernel_hook(trixie.unrun_kernel_paths)],
    )
    assert rootfs.cached_tar(Path("/c"), trixie) != rootfs.cached_tar(Path("/c"), BOOKWORM)


def test_mmdebstrap_command_names_the_release_suite(tmp_path: Path) -> None:
    command = rootfs.mmdebstrap_command(tmp_path / "x.tar", RELEASES["debian13"])
    assert command[-3:] == ["trixie", str(tmp_path / "x.tar"), rootfs.DEBIAN_ARCHIVE]


def test_mmdebstrap_command_builds_what_the_hosts_need(tmp_path: Path) -> None:
    command = rootfs.mmdebstrap_command(tmp_path / "x.tar", BOOKWORM)
    include = next(arg for arg in command if arg.startswith("--include="))
    for package in ("systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "iproute2", "sudo"):
        assert package in include.removeprefix("--include=").split(",")
    assert "--variant=minbase" in command
    assert any("ssh_host_" in arg for arg in command if arg.startswith("--customize-hook="))
    assert command[-3:] == ["bookworm", str(tmp_path / "x.tar"), rootfs.DEBIAN_ARCHIVE]
