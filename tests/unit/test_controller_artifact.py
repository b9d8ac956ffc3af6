"""controller_artifact (issue 37): the controller's copy of an artifact is hashed once per run, not once per host;
a record of another run or of a file changed since is not trusted, and a file of another sha256 is never recorded."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ansible_collections.gpufleet.fleet.plugins.action import controller_artifact
from ansible_collections.gpufleet.fleet.plugins.action.controller_artifact import verify

RUN = "4242:123456"


@pytest.fixture
def artifact(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "cache" / "model.tar.gz"
    path.parent.mkdir()
    path.write_bytes(b"weights" * 1000)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_first_host_hashes_and_the_others_of_the_run_do_not(
    artifact: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, sha256 = artifact
    hashed: list[str] = []
    real = controller_artifact.file_sha256

    def counted(name: str) -> str:
        hashed.append(name)
        return real(name)

    monkeypatch.setattr(controller_artifact, "file_sha256", counted)
    results = [verify(str(path), sha256, str(tmp_path / "records"), RUN) for _host in range(50)]
    assert hashed == [str(path)]
    assert [result["hashed"] for result in results] == [True] + [False] * 49
    assert all(
        result == {"exists": True, "checksum": sha256, "size": 7000, "hashed": result["hashed"]} for result in results
    )
    # The next run hashes it once again.
    assert verify(str(path), sha256, str(tmp_path / "records"), "4243:123999")["hashed"] is True
    assert len(hashed) == 2


def test_a_file_changed_since_the_record_is_hashed_again_and_refused(
    artifact: tuple[Path, str], tmp_path: Path
) -> None:
    path, sha256 = artifact
    records = str(tmp_path / "records")
    assert verify(str(path), sha256, records, RUN)["hashed"] is True
    # Same size, other bytes: the record names the old identity (mtime and ctime changed), so it is not trusted.
    path.write_bytes(b"poisons" * 1000)
    again = verify(str(path), sha256, records, RUN)
    assert again["hashed"] is True and again["checksum"] != sha256
    # Not recorded: every later host of the run hashes it again and finds it wrong.
    assert verify(str(path), sha256, records, RUN)["hashed"] is True


def test_a_missing_file_is_said_to_be_missing(tmp_path: Path) -> None:
    result = verify(str(tmp_path / "absent"), "0" * 64, str(tmp_path / "records"), RUN)
    assert result == {"exists": False, "checksum": None, "size": None, "hashed": False}


def test_the_run_is_the_parent_process_and_its_start() -> None:
    # In a worker, the parent is ansible-playbook; its start time tells a reused pid apart.
    pid, started = controller_artifact.run_identity().split(":")
    assert int(pid) > 0 and started.isdigit()
