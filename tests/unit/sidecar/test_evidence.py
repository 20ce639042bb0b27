"""Captures kept on disk stay bounded, and a failing disk never costs a capture already kept."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest

from frscope.sidecar.evidence import Capture, EvidenceStore


def capture(ns: int, size: int = 100) -> Capture:
    # mtime=0: the same capture compresses to the same bytes whenever it is made
    return Capture("stall", ns, {0: b"x"}, gzip.compress(b"y" * size, mtime=0))


def test_bounded_by_count_and_bytes(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path / "ev", max_files=3, max_bytes=10_000, memory=2)
    for ns in range(1, 6):
        assert store.write(capture(ns))
    names = sorted(p.name for p in (tmp_path / "ev").iterdir())
    assert names == [f"capture-{ns}-stall.json.gz" for ns in (3, 4, 5)]
    assert [c.captured_at_ns for c in store.memory] == [4, 5]
    # a restarted sidecar indexes what is there, and serves the newest
    again = EvidenceStore(tmp_path / "ev", max_files=3, max_bytes=10_000, memory=2)
    assert [c.captured_at_ns for c in again.scan()] == [3, 4, 5]
    assert again.read_latest_from_disk() == capture(5).body_gz


def test_byte_bound_keeps_at_least_the_newest(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path, max_files=10, max_bytes=10, memory=1)
    store.write(capture(1))
    store.write(capture(2))
    assert [p.name for p in tmp_path.iterdir()] == ["capture-2-stall.json.gz"]


def test_failed_write_keeps_memory_and_earlier_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The directory is replaced by a regular file after the first capture: every later write fails
    (ENOTDIR, as a full or read-only disk would fail it with ENOSPC/EROFS). The integration test
    test_sidecar_faults makes the kernel fail the write itself."""
    ev = tmp_path / "ev"
    store = EvidenceStore(ev, max_files=1, max_bytes=1 << 20, memory=4)
    assert store.write(capture(1))
    kept = ev / "capture-1-stall.json.gz"
    moved = tmp_path / "moved"
    ev.rename(moved)
    ev.write_text("not a directory")
    with caplog.at_level(logging.ERROR, logger="frscope.sidecar"):
        assert not store.write(capture(2))
    assert "cannot write" in caplog.text and "kept in memory" in caplog.text
    assert store.last_error and ("EEXIST" in store.last_error or "ENOTDIR" in store.last_error)
    assert [c.captured_at_ns for c in store.memory] == [1, 2]
    assert (moved / kept.name).exists()
    assert len(store.on_disk) == 1  # the index did not drop the earlier capture


def test_memory_only(tmp_path: Path) -> None:
    store = EvidenceStore(None, max_files=1, max_bytes=1, memory=1)
    assert store.write(capture(1)) and store.write(capture(2))
    assert store.latest() is not None and store.latest().captured_at_ns == 2  # type: ignore[union-attr]
    assert store.scan() == [] and store.read_latest_from_disk() is None
