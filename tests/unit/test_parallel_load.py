"""Worker-process loading gives exactly what a single process gives, frames included."""

from __future__ import annotations

from pathlib import Path

from frscope.records import load_dumps
from tests.unit import builders as b


def test_parallel_load_matches_serial(tmp_path: Path) -> None:
    for rank in range(6):
        entries = [
            b.entry(s, frames=[{"name": f"step{rank}", "filename": "/app/train.py", "line": s}]) for s in (1, 2, 3)
        ]
        b.write_pickle(tmp_path, rank, b.dump(entries, world=7))
    (tmp_path / "nccl_trace_rank_6").write_bytes(b"\x80\x02garbage")

    serial = load_dumps([tmp_path], jobs=1)
    parallel = load_dumps([tmp_path], jobs=2)
    assert serial.ranks_loaded == parallel.ranks_loaded == (0, 1, 2, 3, 4, 5)
    assert [(p.source, p.rank) for p in serial.problems if p.kind == "error"] == [
        (p.source, p.rank) for p in parallel.problems if p.kind == "error"
    ]
    for rank in serial.ranks_loaded:
        one, two = serial.dumps[rank].entries, parallel.dumps[rank].entries
        assert [e.to_dict() for e in one] == [e.to_dict() for e in two]
        # Frames were left in the file and are read back on demand in this process.
        assert two[2].frames[0].name == f"step{rank}" and two[2].frames[0].line == 3
