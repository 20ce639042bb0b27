"""The dump-dir watcher: real torch on-timeout pickles (tests/data/real, written by torch's
`_dump_fr_trace()`), parsed only once they stop growing, never through `pickle.load`."""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
import zlib
from pathlib import Path

import pytest

from frscope.records import normalize_dump
from frscope.sidecar.dumpdir import DumpDirWatcher

REAL = Path(__file__).resolve().parents[2] / "data" / "real" / "hang-pickle"


def watcher(directory: Path, settle: float = 0.0) -> DumpDirWatcher:
    return DumpDirWatcher(directory, settle_s=settle, max_bytes=1 << 26, give_up_after_s=5.0)


def age(path: Path, seconds: float = 10.0) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_real_pickles_are_picked_up_and_become_snapshot_pieces(tmp_path: Path) -> None:
    for src in sorted(REAL.iterdir()):
        (tmp_path / src.name).write_bytes(src.read_bytes())
        age(tmp_path / src.name)
    (tmp_path / "nccl_trace_rank_0.pipe").write_text("")  # torch's pipe file: never a dump
    w = watcher(tmp_path)
    assert w.scan(now=0.0).parsed == []  # first sight: not known to be settled yet
    parsed = w.scan(now=1.0).parsed
    assert sorted(f.rank for f in parsed) == [0, 1, 2, 3]
    piece = json.loads(zlib.decompress(w.by_rank()[1].piece or b""))
    assert piece["frscope_snapshot"] == 1 and piece["rank"] == 1
    assert piece["source"] == f"file:{tmp_path / 'nccl_trace_rank_1'}"
    dump = normalize_dump(piece, "x", None)
    assert dump.rank == 1 and dump.entries and dump.backend == "gloo"
    assert w.scan(now=2.0).parsed == []  # parsed once


def test_partial_file_is_not_misread(tmp_path: Path) -> None:
    real = (REAL / "nccl_trace_rank_2").read_bytes()
    target = tmp_path / "nccl_trace_rank_2"
    target.write_bytes(real[: len(real) // 2])  # torch writes in place: half a file is visible
    w = watcher(tmp_path, settle=0.5)
    assert w.scan(now=0.0).parsed == []
    assert w.scan(now=0.2).parsed == []  # not settled yet: not even read
    age(target)
    # settled but cut short: left pending, not rejected, not parsed
    w.scan(now=10.0)
    w.scan(now=10.6)
    item = w.files[str(target)]
    assert item.state == "pending" and item.piece is None
    # the writer finishes
    target.write_bytes(real)
    age(target, 5)
    assert w.scan(now=11.0).parsed == []  # changed: wait again
    parsed = w.scan(now=12.0).parsed
    assert [f.rank for f in parsed] == [2]


def test_cut_short_for_good_is_rejected_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    real = (REAL / "nccl_trace_rank_3").read_bytes()
    target = tmp_path / "nccl_trace_rank_3"
    target.write_bytes(real[:100])
    age(target, 60)
    w = watcher(tmp_path)
    w.scan(now=0.0)
    with caplog.at_level(logging.ERROR, logger="frscope.sidecar"):
        result = w.scan(now=10.0)
    assert [k for _f, k in result.rejected] == ["truncated"]
    assert "giving up" in caplog.text
    assert w.scan(now=20.0).rejected == []


class Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


def test_crafted_pickle_is_refused_without_running_it(tmp_path: Path) -> None:
    target = tmp_path / "nccl_trace_rank_0"
    target.write_bytes(pickle.dumps({"version": "2.10", "entries": [Boom()]}))
    age(target)
    w = watcher(tmp_path)
    w.scan(now=0.0)
    result = w.scan(now=1.0)
    assert [k for _f, k in result.rejected] == ["unsafe"]
    assert "refused" in (w.files[str(target)].error or "")


def test_missing_dir_is_logged_once_and_watched(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing = tmp_path / "not" / "yet"
    w = watcher(missing)
    w.prepare()  # the parent is missing too: not created
    with caplog.at_level(logging.INFO, logger="frscope.sidecar"):
        w.scan(now=0.0)
        w.scan(now=1.0)
        assert caplog.text.count("does not exist") == 1
        assert not w.exists
        missing.mkdir(parents=True)
        w.scan(now=2.0)
    assert w.exists and "is there now" in caplog.text


def test_prepare_creates_the_dir_in_an_existing_volume(tmp_path: Path) -> None:
    w = watcher(tmp_path / "dumps")
    w.prepare()
    assert (tmp_path / "dumps").is_dir()
