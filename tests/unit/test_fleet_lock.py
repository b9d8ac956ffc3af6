"""One operation changes a fleet at a time (gpufleet/locks.py): a second one on the same inventory is refused
naming the first, another inventory is free, and the lock is free again once the first ends, however it ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet import exit_codes
from gpufleet.cli import main
from gpufleet.errors import GpufleetError
from gpufleet.locks import CHANGING_COMMANDS, fleet_operation


@pytest.fixture(autouse=True)
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUFLEET_LOCK_DIR", str(tmp_path / "locks"))
    return tmp_path / "locks"


def test_a_second_operation_is_refused_naming_the_first(tmp_path: Path) -> None:
    inventory, other = tmp_path / "hosts.yml", tmp_path / "other.yml"
    with fleet_operation("upgrade", inventory) as first:
        with pytest.raises(GpufleetError, match=r"is held by `gpufleet upgrade` of .* pid [0-9]+, since 20"):
            with fleet_operation("cordon", inventory):
                pass
        with fleet_operation("prune", other):
            pass
        assert first.lease()["command"] == "gpufleet upgrade"
    with pytest.raises(RuntimeError):
        with fleet_operation("provision", inventory):
            raise RuntimeError("a run that ends badly")
    with fleet_operation("cordon", inventory):
        pass


def test_the_cli_refuses_a_changing_command_while_another_holds_the_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "hosts.yml"
    with fleet_operation("upgrade", inventory):
        assert main(["cordon", "-i", str(inventory), "--limit", "node-1"]) == exit_codes.BUSY
    assert "is held by `gpufleet upgrade`" in capsys.readouterr().err


@pytest.mark.parametrize("command", CHANGING_COMMANDS)
def test_every_changing_command_can_break_a_stale_lease(command: str) -> None:
    from gpufleet.cli import build_parser

    extra = ["--limit", "node-1"] if command in ("cordon", "uncordon", "rebuild") else []
    args = build_parser().parse_args([command, "-i", "hosts.yml", *extra, "--break-lease"])
    assert args.break_lease is True
