"""`gpufleet lab` argument and environment validation: one-line errors, never a traceback."""

from __future__ import annotations

import pytest

from gpufleet.cli import main
from gpufleet.errors import GpufleetError
from gpufleet.lab import preflight
from gpufleet.lab.config import load_config, validate_prefix

GIB = 1024**3


@pytest.mark.parametrize("hosts", ["0", "-1", "-20"])
def test_non_positive_host_count_is_a_one_line_error(hosts: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "up", "--hosts", hosts]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"--hosts must be at least 1 (got {hosts})" in err


def test_too_many_hosts_names_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "up", "--hosts", "500"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "at most" in err and "Traceback" not in err


def test_non_positive_timeout_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "up", "--timeout", "0"]) == 1
    assert "--timeout must be positive" in capsys.readouterr().err


def test_bad_prefix_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "--prefix", "Lab_1", "status"]) == 1
    assert "lab prefix 'Lab_1' is invalid" in capsys.readouterr().err


@pytest.mark.parametrize("prefix", ["lab", "t", "abcdefgh", "x9"])
def test_valid_prefixes_fit_interface_names(prefix: str) -> None:
    assert validate_prefix(prefix) == prefix
    # "ve-" + prefix + "-" + two digits must fit the kernel's 15-character interface names.
    assert len(load_config(prefix=prefix).veth_name(63)) <= 15


@pytest.mark.parametrize("prefix", ["", "9lab", "abcdefghi", "la-b", "LAB"])
def test_invalid_prefixes(prefix: str) -> None:
    with pytest.raises(GpufleetError):
        validate_prefix(prefix)


@pytest.mark.parametrize(
    ("memory_gib", "expected"),
    [(24, 8), (64, 8), (2, 0), (4.5, 1), (9.5, 3), (1, 0)],
)
def test_max_hosts_follows_memory_and_cap(memory_gib: float, expected: int) -> None:
    assert preflight.max_hosts(int(memory_gib * GIB)) == expected


def test_host_count_within_limit_passes() -> None:
    assert preflight.validate_host_count(3, 8) == 3


def test_host_count_on_a_machine_too_small_for_any_host() -> None:
    with pytest.raises(GpufleetError, match="at most 0"):
        preflight.validate_host_count(1, 0)


def test_memory_total_is_read_from_meminfo() -> None:
    assert preflight.memory_total_bytes() > 256 * 1024**2


def test_not_root_is_a_clear_error() -> None:
    with pytest.raises(GpufleetError, match="needs root"):
        preflight.require_root(euid=1000)
    preflight.require_root(euid=0)


def test_missing_tool_names_its_debian_package() -> None:
    tools = {"surely-not-installed-gpufleet-tool": "gpufleet-fake-package", "sh": "dash"}
    assert preflight.missing_tools(tools) == {"surely-not-installed-gpufleet-tool": "gpufleet-fake-package"}
    with pytest.raises(GpufleetError, match="apt-get install gpufleet-fake-package"):
        preflight.require_tools(tools)
