"""The wait-for model (frscope.analysis.waitfor) on small exact situations: each rank's state, whom it
waits on, and wait chains through p2p peers. Built from torch-shaped records (NCCL pickles, gloo
snapshot pieces with faulthandler stacks as the worker server returns them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frscope import wire
from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.analysis.context import Context
from frscope.analysis.tracks import build_tracks
from frscope.analysis.waitfor import State
from frscope.records import DumpSet, assemble, load_dumps, normalize_dump
from frscope.report.serialize import report_to_dict
from frscope.report.text import render_text
from tests.unit import builders as b

S = 1_000_000_000
SITE = "/venv/lib/python3.11/site-packages/torch/distributed"
SERVER = "Current thread 0x00007f0a8d7fa6c0 (most recent call first):\n  <no Python frame>\n\n"


def _stack(*frames: tuple[str, str, int]) -> str:
    lines = [f'  File "{file}", line {line} in {name}' for name, file, line in frames]
    return SERVER + "Thread 0x00007f3e247c9b80 (most recent call first):\n" + "\n".join(lines) + "\n"


RECV = _stack(("recv", f"{SITE}/distributed_c10d.py", 2600), ("main", "/app/train.py", 40))
ALL_REDUCE = _stack(("all_reduce", f"{SITE}/distributed_c10d.py", 2800), ("main", "/app/train.py", 41))
IN_PYTHON = _stack(("load_next_batch", "/app/train.py", 177), ("main", "/app/train.py", 163))


def _context(dumpset: DumpSet) -> Context:
    return Context(dumpset, build_tracks(dumpset), AnalysisOptions())


def _gloo(seq: int, *, done: bool = True) -> dict[str, Any]:
    return b.entry(seq, backend="gloo", state="scheduled", retired=done, created_ns=b.T0 + seq * S // 5)


def _gloo_capture(recorders: dict[int, list[dict[str, Any]]], stacks: dict[int, str], world: int) -> DumpSet:
    pieces = []
    for rank, entries in recorders.items():
        pieces.append(wire.snapshot_piece(rank, b.T0 + 700 * S, f"socket:/run/rank-{rank}.sock", stacks.get(rank, ""),
                                          b.dump(entries, world=world)))
    return assemble([normalize_dump(p, p["source"], p["rank"]) for p in pieces], [])


def test_each_rank_state_and_whom_a_gloo_collective_waits_on() -> None:
    # Ranks 0 and 1 wait in all_reduce #4; rank 2 is in Python after #3; rank 3 sits in an unrecorded recv;
    # rank 4 left no dump.
    recorders = {0: [*map(_gloo, range(1, 4)), _gloo(4, done=False)],
                 1: [*map(_gloo, range(1, 4)), _gloo(4, done=False)],
                 2: list(map(_gloo, range(1, 4))),
                 3: list(map(_gloo, range(1, 4)))}
    ctx = _context(_gloo_capture(recorders, {0: ALL_REDUCE, 1: ALL_REDUCE, 2: IN_PYTHON, 3: RECV}, world=5))
    w0 = ctx.waits.of(0)
    assert w0.state is State.BLOCKED and w0.blocks_caller and w0.entry is not None
    assert w0.entry.collective_seq_id == 4
    assert w0.collective_waits == {2, 3}  # the members with a recorder that never entered #4
    assert not w0.sink
    assert ctx.waits.of(2).state is State.IN_PYTHON and ctx.waits.of(2).sink
    w3 = ctx.waits.of(3)
    assert w3.state is State.IN_UNRECORDED and w3.on is None and not w3.sink  # waits, on someone unnamed
    assert ctx.waits.of(4).state is State.MISSING
    # Of the ranks that never joined #4, the one in the recv waits on another: the sink is rank 2.
    assert ctx.waits.sinks_among([2, 3]) == ([2], [3])


def test_a_gpu_collective_holds_the_stream_not_the_thread_unless_the_stack_says_so(tmp_path: Path) -> None:
    per_rank = {r: [b.entry(s) for s in range(1, 4)] for r in range(3)}
    for r in (0, 1):
        per_rank[r].append(b.entry(4, state="started"))
    ctx = _context(load_dumps([b.job(tmp_path, per_rank, 3)]))
    wait = ctx.waits.of(0)
    assert wait.state is State.BLOCKED and wait.on == {2}
    assert not wait.blocks_caller and wait.collective_waits == frozenset()
    assert ctx.waits.of(2).state is State.IDLE


def test_a_p2p_chain_is_followed_to_the_collective_it_ends_in(tmp_path: Path) -> None:
    # Pipeline stages on NCCL: rank 0 receives from 1, rank 1 receives from 2, rank 2 is held in all_reduce #4
    # that rank 3 never entered.
    per_rank = {r: [b.entry(s) for s in range(1, 4)] for r in range(4)}
    t = b.T0 + 10 * S
    per_rank[0].append(b.entry(4, op="recv", peer=" 0<-1", p2p_seq=1, state="started", record_id=3, created_ns=t))
    per_rank[1].append(b.entry(4, op="recv", peer=" 1<-2", p2p_seq=1, state="started", record_id=3, created_ns=t))
    per_rank[2].append(b.entry(4, state="started", record_id=3, created_ns=t))
    ctx = _context(load_dumps([b.job(tmp_path, per_rank, 4)]))
    hops = ctx.waits.chain(0)
    assert [w.rank for w in hops] == [0, 1, 2]
    end = hops[-1]
    assert end.entry is not None and not end.entry.is_p2p and end.entry.collective_seq_id == 4
    # Every member that never entered #4 is waited on: rank 3, and ranks 0 and 1, blocked in their recvs.
    assert end.on == {0, 1, 3}


def test_a_loop_of_p2p_waits_stops_where_it_closes(tmp_path: Path) -> None:
    per_rank = {r: [b.entry(s) for s in range(1, 4)] for r in range(2)}
    t = b.T0 + 10 * S
    per_rank[0].append(b.entry(4, op="recv", peer=" 0<-1", p2p_seq=1, state="started", record_id=3, created_ns=t))
    per_rank[1].append(b.entry(4, op="recv", peer=" 1<-0", p2p_seq=1, state="started", record_id=3, created_ns=t))
    ctx = _context(load_dumps([b.job(tmp_path, per_rank, 2)]))
    hops = ctx.waits.chain(0)
    assert [w.rank for w in hops] == [0, 1]
    assert hops[-1].on == {0}  # the last hop waits on the first: a cycle, no sink on this chain


def _gloo_pg(seq: int, pg: str, *, done: bool = True, at: int = 0) -> dict[str, Any]:
    return b.entry(seq, backend="gloo", pg=(pg, "undefined" if pg != "0" else "default_pg"), state="scheduled",
                   retired=done, created_ns=b.T0 + at * S // 5)


def _subgroup_hang(tmp_path: Path, statuses: dict[int, list[str]]) -> Path:
    """6 gloo ranks: groups '1' = {0, 1, 2} and '2' = {3, 4, 5} (new_subgroups: gloo's pg_config names no
    members). Ranks 1 and 2 wait in group 1's all_reduce #1; rank 0, its third member, never came (stuck in
    Python after the default group's #1); ranks 3-5 finished group 2's #1 and are idle too."""
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(6):
        entries = [_gloo_pg(1, "0", at=1)]
        if rank in (1, 2):
            entries.append(_gloo_pg(1, "1", done=False, at=2))
        if rank >= 3:
            entries.append(_gloo_pg(1, "2", at=2))
        for i, e in enumerate(entries):
            e["record_id"] = i
        per_rank[rank] = entries
    for rank, entries in per_rank.items():
        data = b.dump(entries, world=6, pg_config={"": {"name": "", "desc": "", "ranks": "[]"}})
        data["pg_status"] = {k: {"last_enqueued_collective": 1, "last_started_collective": -1,
                                 "last_completed_collective": 1} for k in statuses[rank]}
        b.write_pickle(tmp_path, rank, data)
    return tmp_path


def test_principle3_ranks_waiting_in_a_gloo_collective_every_seen_member_entered_wait_on_an_unseen_member(
        tmp_path: Path) -> None:
    # Ranks 1 and 2 number their groups 0 (default) and 1 (group '1'); ranks 3-5: 0 and 1 (group '2'); rank 0
    # lists only 0: it belongs to a group it never recorded in. Ranks 3-5 recorded in group '2', created
    # after group '1', with no gap in their numbers: no member of group '1'.
    statuses = {0: ["0"], 1: ["0", "1"], 2: ["0", "1"], 3: ["0", "1"], 4: ["0", "1"], 5: ["0", "1"]}
    report = analyze(load_dumps([_subgroup_hang(tmp_path, statuses)]),
                     AnalysisOptions(now_ns=b.T0 + 700 * S))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (0,), first.summary
    assert not first.ambiguous
    assert any("no member of it" in e for e in first.evidence)


def test_without_group_numbers_every_idle_rank_outside_the_group_is_a_candidate(tmp_path: Path) -> None:
    statuses: dict[int, list[str]] = {r: [] for r in range(6)}
    report = analyze(load_dumps([_subgroup_hang(tmp_path, statuses)]),
                     AnalysisOptions(now_ns=b.T0 + 700 * S))
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (0, 3, 4, 5), first.summary
    assert first.ambiguous  # not NotCompleted: gloo completes a collective every member entered
    assert first.would_decide is not None and "member list" in first.would_decide
    text = render_text(report)
    assert f"what would decide: {first.would_decide}" in text
    assert report_to_dict(report)["findings"][0]["would_decide"] == first.would_decide


def test_principle1_an_unseen_member_that_waits_elsewhere_passes_the_wait_on() -> None:
    # Group '1' ({0, 1}, a new_group gloo's pg_config names no members of): rank 1 waits in its all_reduce #1,
    # the only member its entries show. Ranks 0 and 2 both receive first from each other (a p2p deadlock gloo
    # does not record; their stacks show it); rank 3 waits in the default group's #2 for them. No rank waits
    # on nobody: the unseen member is among those that wait elsewhere, and the wait goes on to the deadlock.
    recorders = {0: [_gloo_pg(1, "0", at=1)], 2: [_gloo_pg(1, "0", at=1)],
                 1: [_gloo_pg(1, "0", at=1), _gloo_pg(1, "1", done=False, at=2)],
                 3: [_gloo_pg(1, "0", at=1), _gloo_pg(2, "0", done=False, at=3)]}
    for entries in recorders.values():
        for i, e in enumerate(entries):
            e["record_id"] = i
    pieces = [wire.snapshot_piece(r, b.T0 + 700 * S, f"socket:/run/rank-{r}.sock",
                                  {0: RECV, 1: ALL_REDUCE, 2: RECV, 3: ALL_REDUCE}[r],
                                  b.dump(entries, world=4, pg_config={"": {"name": "", "desc": "", "ranks": "[]"}}))
              for r, entries in recorders.items()]
    report = analyze(assemble([normalize_dump(p, p["source"], p["rank"]) for p in pieces], []),
                     AnalysisOptions(stall_after_s=10.0))
    first = report.findings[0]
    assert first.category is Category.P2P_MISMATCH and set(first.culprit_ranks) == {0, 2}, first.summary
    assert not any(f.category is Category.NOT_COMPLETED for f in report.findings)
