"""What the wait-for model reads from the order of a rank's calls (issue 33, principle 1), on small exact
situations built as torch writes them: a rank that entered a collective ahead of its own order (an extra call
or one after a skip) is read by the wait-for graph, not by the ops it meets there; and where gloo's
monitored_barrier runs (its group) is read from the two collective sequence numbers each barrier uses up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frscope import wire
from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.records import assemble, load_dumps, normalize_dump
from tests.unit import builders as b

S = 1_000_000_000
EXPERT = ("1", "expert")
PG_CONFIG = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3, 4]"},
             "1": {"name": "1", "desc": "expert", "ranks": "[0, 1, 2, 4]"}}


def _gloo(seq: int, op: str, pg: tuple[str, str], t: int, done: bool = True) -> dict[str, Any]:
    # an all_gather's output holds every member's input: 4 of `expert`, 5 of the default group
    out = [[4 * (4 if pg == EXPERT else 5)]] if op == "all_gather" else None
    return b.entry(seq, op=op, backend="gloo", pg=pg, sizes=[[4]], out_sizes=out, state="scheduled", retired=done,
                   created_ns=t)


def _extra_call_job(directory: Path) -> Path:
    """5 gloo ranks; a step is all_reduce on `expert` [0, 1, 2, 4], all_reduce on the default group, all_gather
    on `expert`, all_gather on the default group. At step 4 rank 4 calls the default group's all_reduce once
    more (an extra call) where its peers go on to `expert`'s all_gather: ranks 0-2 wait there for rank 4, rank
    3 (not in `expert`) waits in the default group's all_gather #8, where rank 4's extra all_reduce is."""
    per_rank: dict[int, list[dict[str, Any]]] = {r: [] for r in range(5)}
    t = b.T0
    for step in range(4):
        for r in range(5):
            t_r = t + step * S + r * 1000
            if r != 3:
                per_rank[r].append(_gloo(2 * step + 1, "all_reduce", EXPERT, t_r))
            per_rank[r].append(_gloo(2 * step + 1, "all_reduce", ("0", "default_pg"), t_r + 1_000_000))
            if step < 3:
                if r != 3:
                    per_rank[r].append(_gloo(2 * step + 2, "all_gather", EXPERT, t_r + 2_000_000))
                per_rank[r].append(_gloo(2 * step + 2, "all_gather", ("0", "default_pg"), t_r + 3_000_000))
    end = t + 3 * S + 2_000_000
    for r in (0, 1, 2):
        per_rank[r].append(_gloo(8, "all_gather", EXPERT, end, done=False))
    per_rank[3].append(_gloo(8, "all_gather", ("0", "default_pg"), end, done=False))
    per_rank[4].append(_gloo(8, "all_reduce", ("0", "default_pg"), end, done=False))
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e["record_id"] = i
        b.write_pickle(directory, rank, b.dump(entries, world=5, pg_config=PG_CONFIG))
    return directory


def test_an_extra_call_that_meets_the_next_op_is_read_by_the_wait_for_graph(tmp_path: Path) -> None:
    """Rank 4's all_reduce meets rank 3's all_gather at #8 of the default group, but ranks 0-2 never entered
    #8: they wait in `expert` for rank 4, which had it kept their order would have joined them first. Its call
    at #8 is out of its order, not a wrong op: the culprit is rank 4, which never joined `expert`'s all_gather."""
    report = analyze(load_dumps([_extra_call_job(tmp_path)]), AnalysisOptions(now_ns=b.T0 + 600 * S))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (4,), first.summary
    assert first.process_group.name == "1", first.summary
    assert not any(f.category is Category.COLLECTIVE_TYPE_MISMATCH for f in report.findings)


SITE = "/venv/lib/python3.11/site-packages/torch/distributed"
SERVER = "Current thread 0x00007f0a8d7fa6c0 (most recent call first):\n  <no Python frame>\n\n"


def _stack(*frames: tuple[str, str, int]) -> str:
    lines = [f'  File "{file}", line {line} in {name}' for name, file, line in frames]
    return SERVER + "Thread 0x00007f3e247c9b80 (most recent call first):\n" + "\n".join(lines) + "\n"


BARRIER = _stack(("monitored_barrier", f"{SITE}/distributed_c10d.py", 5435), ("main", "/app/train.py", 166))
STUCK = _stack(("save_checkpoint", "/app/train.py", 77), ("main", "/app/train.py", 163))
DONE = _stack(("wait_for_next_epoch", "/app/train.py", 310), ("main", "/app/train.py", 318))
BARRIER_CONFIG = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3, 4, 5]"},
                  "1": {"name": "1", "desc": "expert", "ranks": "[0, 2, 3, 4, 5]"}}


def test_a_monitored_barrier_waits_on_the_members_of_the_group_its_sequence_gaps_show() -> None:
    """Ranks 2-5 wait in monitored_barrier; rank 0 (stuck saving a checkpoint) and rank 1 (done, not in
    `expert`) are both in Python. Every step's barrier used up two of `expert`'s sequence numbers (1, 4, 7, ...
    recorded, the two between never): the barriers run on `expert`, whose members do not include rank 1.
    The waits end at rank 0 alone."""
    last = b.T0 + 100 * S
    pieces = []
    for rank, text in {0: STUCK, 1: DONE, 2: BARRIER, 3: BARRIER, 4: BARRIER, 5: BARRIER}.items():
        entries = [_gloo(1, "broadcast", ("0", "default_pg"), b.T0)]
        if rank != 1:
            entries += [_gloo(3 * k + 1, "all_reduce", EXPERT, b.T0 + (k + 1) * S) for k in range(8)]
        for i, e in enumerate(entries):
            e["record_id"] = i
        pieces.append(wire.snapshot_piece(rank, last + 300 * S, f"socket:/run/rank-{rank}.sock", text,
                                          b.dump(entries, world=6, pg_config=BARRIER_CONFIG)))
    dumps = [normalize_dump(piece, piece["source"], piece["rank"]) for piece in pieces]
    report = analyze(assemble(dumps, []), AnalysisOptions(stall_after_s=10.0))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (0,), first.summary
    assert first.op == "monitored_barrier"
