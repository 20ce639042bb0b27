"""The library jobs' snapshot form as frscope's sidecar would have captured it: a rank that died before the
capture is its last read (the periodic dump it left) with the collector's "socket is gone", no live stack;
a rank alive at the capture is its piece with its stack (frscope.testing.libjobs.launch)."""

from __future__ import annotations

import json
from pathlib import Path

from frscope.records import load_dumps
from frscope.testing.libjobs.launch import _stage
from tests.unit import builders as b


def test_a_rank_that_died_before_the_capture_is_its_last_read_with_its_socket_gone(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    for rank in (0, 1):
        (job / f"rank_{rank}.json").write_text(json.dumps(b.dump([b.entry(1, backend="gloo")], world=2)))
        (job / f"rank_{rank}.stack.txt").write_text("Thread 0x1 (most recent call first):\n"
                                                    '  File "/app/train.py", line 3 in main\n')
    (job / "captured-1").write_text(json.dumps({"captured_at_ns": b.T0 + 5}))
    truth = {"captured_at_ns": {"0": b.T0, "1": b.T0 + 5}}
    dumpset = load_dumps(_stage(job, "snap", tmp_path / "staged", truth))
    assert sorted(dumpset.dumps) == [0, 1]
    assert [p.rank for p in dumpset.problems if "socket is gone" in p.message] == [0]
    assert not dumpset.dumps[0].stacks and dumpset.dumps[1].stacks
