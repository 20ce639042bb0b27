"""Issue 33's principle 1 where a wait shows only in a stack: gloo's monitored_barrier records nothing
and waits for every member of its group that is not in it (not for one partner, as send/recv do). A rank
in the barrier while others are blocked in a recorded collective it never joined is one side of a cycle;
the culprit is the side whose order or count differs, never a "p2p pairing" of the barrier's ranks. The
stacks are faulthandler's text as torch's worker server returns it; the recorders are gloo-shaped."""

from __future__ import annotations

from typing import Any

from frscope import wire
from frscope.analysis import AnalysisOptions, Category, Report, analyze
from frscope.records import assemble, normalize_dump
from tests.unit import builders as b
from tests.unit.test_unrecorded_waits import SITE, S, _stack  # faulthandler's text, as the worker server returns it

BARRIER = _stack(("monitored_barrier", f"{SITE}/distributed_c10d.py", 5435), ("wait_for_peers", "/app/train.py", 127),
                 ("main", "/app/train.py", 166))
IN_COLLECTIVE = _stack(("gather", f"{SITE}/distributed_c10d.py", 4667), ("gather_metrics", "/app/train.py", 134),
                       ("main", "/app/train.py", 166))
IN_PYTHON = _stack(("load_next_batch", "/app/train.py", 177), ("main", "/app/train.py", 163))


def _gloo(seq: int, *, done: bool = True, pg: tuple[str, str] = ("0", "default_pg")) -> dict[str, Any]:
    return b.entry(seq, backend="gloo", pg=pg, state="scheduled", retired=done, created_ns=b.T0 + seq * S // 5)


def _capture(recorders: dict[int, list[dict[str, Any]]], stacks: dict[int, str],
             groups: dict[str, list[int]] | None = None) -> Report:
    world = len(recorders)
    config = {name: {"name": name, "desc": "default_pg" if name == "0" else "sub", "ranks": str(ranks)}
              for name, ranks in (groups or {"0": list(range(world))}).items()}
    pieces = []
    for rank, entries in recorders.items():
        for i, e in enumerate(entries):
            e.setdefault("record_id", i)
        pieces.append(wire.snapshot_piece(rank, b.T0 + 700 * S, f"socket:/run/rank-{rank}.sock", stacks[rank],
                                          b.dump(entries, world=world, pg_config=config)))
    dumps = [normalize_dump(piece, piece["source"], piece["rank"]) for piece in pieces]
    return analyze(assemble(dumps, []), AnalysisOptions(stall_after_s=10.0))


def test_a_rank_in_the_barrier_while_the_others_wait_in_a_collective_it_skipped_never_joined_it() -> None:
    # Rank 1 skipped gather #11 and went on to the barrier, which waits for the others; they wait in #11
    # for rank 1. The barrier's one rank is no p2p pairing "with no partner": it never joined #11.
    done = [_gloo(s) for s in range(1, 11)]
    recorders = {r: [*done, _gloo(11, done=False)] for r in (0, 2, 3, 4)}
    recorders[1] = list(done)
    stacks = {r: IN_COLLECTIVE for r in (0, 2, 3, 4)} | {1: BARRIER}
    first = _capture(recorders, stacks).findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (1,), first.summary
    assert first.collective_seq_id == 11


def test_the_one_rank_in_a_collective_the_others_left_for_the_barrier_called_one_more() -> None:
    # The mirror: rank 2 ran one collective more; ranks 0, 1, 3 went on to the barrier, which waits for
    # rank 2. The odd side is the one rank in #11, not the three that kept the common order.
    done = [_gloo(s) for s in range(1, 11)]
    recorders = {r: list(done) for r in (0, 1, 3)}
    recorders[2] = [*done, _gloo(11, done=False)]
    stacks = {r: BARRIER for r in (0, 1, 3)} | {2: IN_COLLECTIVE}
    first = _capture(recorders, stacks).findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (2,), first.summary
    assert "one collective more" in first.summary


def test_two_ranks_one_in_the_barrier_one_in_python_name_the_one_in_python() -> None:
    # Every recorder idle; rank 1 waits in the barrier, and the only other rank sits in Python.
    done = [_gloo(s) for s in range(1, 11)]
    report = _capture({0: list(done), 1: list(done)}, {0: IN_PYTHON, 1: BARRIER})
    assert [(f.category, f.culprit_ranks) for f in report.findings] == [(Category.RANK_NOT_JOINED, (0,))]


def test_a_rank_in_the_barrier_is_no_sink_beside_the_rank_in_python_it_waits_for() -> None:
    # Rank 2 sits in Python; rank 0 waits for it in group 1 (0, 2); rank 3 waits in the barrier (for rank 2),
    # and rank 1 waits for rank 3 in group 2 (1, 3). Rank 3's recorder is idle, but its stack waits: only
    # rank 2 waits on nobody.
    groups = {"0": [0, 1, 2, 3], "1": [0, 2], "2": [1, 3]}
    base = [_gloo(s) for s in range(1, 5)]
    recorders = {0: [*base, _gloo(1, done=False, pg=("1", "sub"))], 1: [*base, _gloo(1, done=False, pg=("2", "sub"))],
                 2: list(base), 3: list(base)}
    stacks = {0: IN_COLLECTIVE, 1: IN_COLLECTIVE, 2: IN_PYTHON, 3: BARRIER}
    first = _capture(recorders, stacks, groups).findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (2,), first.summary


RECV = _stack(("recv", f"{SITE}/distributed_c10d.py", 2600), ("exchange", "/app/train.py", 210),
              ("main", "/app/train.py", 166))


def test_ranks_in_the_barrier_wait_for_a_p2p_pair_and_are_not_part_of_it() -> None:
    # Ranks 0 and 1 both receive from each other first (a p2p deadlock); rank 2 went on to the barrier,
    # which waits for them. The barrier's rank is no odd member of the pairing.
    done = [_gloo(s) for s in range(1, 11)]
    report = _capture({r: list(done) for r in range(3)}, {0: RECV, 1: RECV, 2: BARRIER})
    first = report.findings[0]
    assert first.category is Category.P2P_MISMATCH and first.culprit_ranks == (0, 1), first.summary


def test_a_rank_in_python_named_by_a_recorded_wait_is_not_merged_with_other_idle_ranks() -> None:
    # Ranks 0 and 2 wait in group 1's #2 for rank 1 (in Python, it skipped it); ranks 3-5 wait in barriers
    # (for ranks 0 and 2, blocked); rank 6 finished and idles in Python too. The stacks alone would say "1 or 6
    # never joined the barrier": the recorder says whom 0 and 2 wait for, and rank 1 waits on nobody.
    groups = {"0": list(range(7)), "1": [0, 1, 2]}
    base = [_gloo(s) for s in range(1, 5)]
    sub_done = [_gloo(1, pg=("1", "sub"))]
    recorders = {r: [*base, *sub_done] for r in range(7) if r not in (3, 4, 5, 6)}
    recorders |= {r: list(base) for r in (3, 4, 5, 6)}
    for r in (0, 2):
        recorders[r].append(_gloo(2, done=False, pg=("1", "sub")))
    stacks = {0: IN_COLLECTIVE, 1: IN_PYTHON, 2: IN_COLLECTIVE, 3: BARRIER, 4: BARRIER, 5: BARRIER, 6: IN_PYTHON}
    first = _capture(recorders, stacks, groups).findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (1,), first.summary
    assert first.process_group.name == "1"
