"""Token files that rotate under the operator (the API server's side is in tests/e2e/test_auth_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frscope.operator.kube import TokenFile


def test_a_rotated_file_is_read_again_and_a_half_written_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    source = TokenFile(path)
    assert source.token() == "first"
    # The kubelet's swap: a new file under the same name.
    (tmp_path / "next").write_text("second")
    (tmp_path / "next").replace(path)
    assert source.token() == "second"
    path.write_text("")  # caught mid-write: the previous token stays
    assert source.token() == "second"
    path.unlink()
    assert source.token() == "second" and not source.reload()
    path.write_text("third")
    assert source.reload() and source.token() == "third"


def test_a_wrong_path_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token file"):
        TokenFile(tmp_path / "missing")
    (tmp_path / "empty").write_text(" \n")
    with pytest.raises(ValueError, match="is empty"):
        TokenFile(tmp_path / "empty")
