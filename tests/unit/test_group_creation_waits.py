"""Issue 33's principle 1 where a wait shows only in a stack: creating a process group (`new_group`,
`new_subgroups`) is collective too, its ranks meet in the store, and the recorder keeps nothing of it. A
rank whose stack is inside one waits for the ranks that have not come to create it; it is no sink, and a
rank in Python that never came is where the waits end. The stacks are faulthandler's text as torch's
worker server returns it (the store wait innermost); the recorders are gloo-shaped."""

from __future__ import annotations

from typing import Any

from frscope import wire
from frscope.analysis import AnalysisOptions, Category, Report, analyze
from frscope.records import assemble, normalize_dump
from tests.unit import builders as b
from tests.unit.test_unrecorded_waits import SITE, S, _stack  # faulthandler's text, as the worker server returns it

C10D = f"{SITE}/distributed_c10d.py"
CREATING = _stack(("_new_process_group_helper", C10D, 2169), ("_new_group_with_tag", C10D, 6056),
                  ("new_group", C10D, 5863), ("wrapper", f"{SITE}/c10d_logger.py", 83),
                  ("build_eval_group", "/app/train.py", 88), ("main", "/app/train.py", 166))
SUBGROUPS = _stack(("_store_based_barrier", C10D, 4661), ("_new_group_with_tag", C10D, 6056),
                   ("new_group", C10D, 5863), ("new_subgroups", C10D, 6214), ("main", "/app/train.py", 150))
IN_COLLECTIVE = _stack(("all_reduce", C10D, 3252), ("wrapper", f"{SITE}/c10d_logger.py", 83),
                       ("train_step", "/app/train.py", 134), ("main", "/app/train.py", 166))
IN_PYTHON = _stack(("load_eval_set", "/app/train.py", 177), ("main", "/app/train.py", 163))


def _gloo(seq: int, *, done: bool = True) -> dict[str, Any]:
    return b.entry(seq, backend="gloo", state="scheduled", retired=done, created_ns=b.T0 + seq * S // 5)


def _capture(recorders: dict[int, list[dict[str, Any]]], stacks: dict[int, str]) -> Report:
    world = len(recorders)
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    pieces = []
    for rank, entries in recorders.items():
        for i, e in enumerate(entries):
            e.setdefault("record_id", i)
        pieces.append(wire.snapshot_piece(rank, b.T0 + 700 * S, f"socket:/run/rank-{rank}.sock", stacks[rank],
                                          b.dump(entries, world=world, pg_config=config)))
    dumps = [normalize_dump(piece, piece["source"], piece["rank"]) for piece in pieces]
    return analyze(assemble(dumps, []), AnalysisOptions(stall_after_s=10.0))


def test_ranks_creating_a_group_wait_for_the_rank_in_python_that_never_came() -> None:
    # Every recorder idle after #10; ranks 0, 2, 3, 4 are inside new_group, rank 1 sits in Python.
    done = [_gloo(s) for s in range(1, 11)]
    stacks = {r: CREATING for r in (0, 2, 3, 4)} | {1: IN_PYTHON}
    report = _capture({r: list(done) for r in range(5)}, stacks)
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (1,), first.summary
    assert "new_group" in first.summary


def test_a_store_wait_inside_new_subgroups_reads_as_creating_a_group() -> None:
    done = [_gloo(s) for s in range(1, 11)]
    stacks = {r: SUBGROUPS for r in (0, 1, 3)} | {2: IN_PYTHON}
    first = _capture({r: list(done) for r in range(4)}, stacks).findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (2,), first.summary


def test_every_rank_creating_a_group_together_is_no_finding() -> None:
    # Nobody is in Python or missing: whatever holds them, no rank is the one that never came.
    done = [_gloo(s) for s in range(1, 11)]
    report = _capture({r: list(done) for r in range(4)}, dict.fromkeys(range(4), CREATING))
    assert not [f for f in report.findings if f.category is Category.RANK_NOT_JOINED], \
        [f.summary for f in report.findings]


def test_a_rank_creating_a_group_is_no_sink_where_the_others_wait_in_a_collective_it_skipped() -> None:
    # Rank 3 went on to create a group; the others wait in all_reduce #11, which it never entered. It is the
    # one that left the common order (the others' waits end at it), not a rank idle "in Python".
    done = [_gloo(s) for s in range(1, 11)]
    recorders = {r: [*done, _gloo(11, done=False)] for r in (0, 1, 2)}
    recorders[3] = list(done)
    stacks = {r: IN_COLLECTIVE for r in (0, 1, 2)} | {3: CREATING}
    first = _capture(recorders, stacks).findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (3,), first.summary
