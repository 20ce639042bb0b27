"""A rank's recorder at a moment, as torch dumps it: `_dump_fr_trace_json()`'s object or
`_dump_fr_trace()`'s dict (key order, None vs 0, tuple vs list and pg_status types as torch 2.13 writes
them, checked field for field against real gloo dumps by tests/unit/test_randprog_fidelity.py).

gloo: state 'scheduled' only, no start/complete times (None in the pickle, 0 in JSON), point-to-point ops
unrecorded, `retired` once the op finished, `pg_status` keyed by the rank-local uid with op ids
(point-to-point included) and `last_started_collective` -1, and `pg_config` keyed '' with the ranks of
the last group the rank built (`[]` for a `new_group` member, `[0..n-1]` otherwise). NCCL: scheduled /
started / completed with discovery times and `duration_ms`, 'send a->b' / 'recv a<-b' entries with
group-local peers, `pg_config` per group name with its ranks, and `pg_status` in collective ids.
Older format versions drop the fields they did not have yet.
"""

from __future__ import annotations

from typing import Any

from frscope.testing.randprog.executor import FAILED, Execution, Issued, RankState
from frscope.testing.randprog.layout import DEFAULT, NEW_GROUP
from frscope.testing.randprog.stacks import entry_frames

NS = 1_000_000_000
TIMEOUT_MS = {"gloo": 1_800_000, "nccl": 600_000}
# Fields each older format version lacks (normalized by frscope.records with a warning per field).
OLDER = {"2.10": (), "2.4": ("thread_id", "thread_name"), "2.2": ("thread_id", "thread_name", "timeout_ms", "is_p2p")}


def ns(ex: Execution, t: float) -> int:
    return ex.t0_ns + int(t * NS)


def _started(ex: Execution, st: RankState, e: Issued, tv: float) -> float | None:
    """NCCL: when the watchdog saw the kernel start (its stream reached it: the previous op on the group
    finished), or None."""
    if e.rec is None or not e.rdv:
        return e.t_created + 0.00001
    # collectives run on the group's stream; p2p ops on their peer pair's (a communicator per pair, as the
    # executor orders them: an op to rank 2 does not wait for a recv from rank 0)
    if e.p2p_name:
        mine = _peers(st.rank, e)
        before = [p for p in st.issued if p.group == e.group and p.record_id < e.record_id and p.p2p_name
                  and _peers(st.rank, p) & mine]
    else:
        before = [p for p in st.issued if p.group == e.group and p.record_id < e.record_id and not p.p2p_name]
    prevs = []
    for peer in {q for p in before for q in _peers(st.rank, p)} if e.p2p_name else {None}:
        last = [p for p in before if peer is None or peer in _peers(st.rank, p)]
        if last:
            prevs.append(last[-1].done_at())
    if prevs:
        if any(prev is None or prev > tv for prev in prevs):
            return None
        return max(e.t_created, *(prev for prev in prevs if prev is not None)) + 0.00001
    return e.t_created + 0.00001


def _peers(rank: int, e: Issued) -> set[int]:
    """The ranks a p2p entry's messages go to or come from."""
    rdvs = e.rdv if isinstance(e.rdv, tuple) else (e.rdv,)
    return {int(k) for rdv in rdvs if rdv.key[0] == "p" for k in rdv.key[2:4] if int(k) != rank}


def _entry(ex: Execution, st: RankState, e: Issued, tv: float, pickle: bool, version: str,
           thread: str) -> dict[str, Any]:
    nccl = ex.program.backend == "nccl"
    layout = ex.program.layout
    group = layout.groups[e.group]
    done = e.done_at()
    completed = done is not None and done <= tv
    if st.status == FAILED and tv >= st.t and st.blocked and e.rdv is st.blocked[0]:
        completed = True  # gloo retires an op that failed as if it had succeeded
    rec = e.rec
    assert rec is not None
    name = ("nccl:" if nccl else "gloo:") + (e.p2p_name or rec.op)
    pg = (group.name, group.desc)
    started = _started(ex, st, e, tv) if nccl else None
    if nccl:
        state = "completed" if completed else ("started" if started is not None and started <= tv else "scheduled")
    else:
        state = "scheduled"
    t_start = ns(ex, started) if nccl and state != "scheduled" and started is not None else None
    t_done = ns(ex, done) + 20_000 if nccl and completed and done is not None else None
    out: dict[str, Any] = {}
    if pickle:
        out["frames"] = entry_frames(e.op, rec, ex.program.backend)
    out.update({
        "record_id": e.record_id, "pg_id": layout.uid(st.rank, e.group), "process_group": pg if pickle else list(pg),
        "thread_name": "python3", "thread_id": thread, "collective_seq_id": e.coll_seq, "p2p_seq_id": e.p2p_seq,
        "op_id": e.op_id, "profiling_name": name, "time_created_ns": ns(ex, e.t_created),
    })
    if nccl and completed and t_start is not None and t_done is not None:
        out["duration_ms"] = round((t_done - t_start) / 1e6, 3)
    out.update({
        "input_sizes": [list(s) for s in rec.in_sizes], "input_dtypes": list(rec.in_dtypes),
        "output_sizes": [list(s) for s in rec.out_sizes], "output_dtypes": list(rec.out_dtypes),
        "state": state,
        "time_discovered_started_ns": t_start if t_start is not None or pickle else 0,
        "time_discovered_completed_ns": t_done if t_done is not None or pickle else 0,
        "retired": completed, "timeout_ms": TIMEOUT_MS[ex.program.backend], "is_p2p": bool(e.p2p_name),
    })
    for key in OLDER[version]:
        out.pop(key, None)
    return out


def _pg_config(ex: Execution, rank: int, pickle: bool) -> dict[str, Any]:
    layout = ex.program.layout
    mine = layout.member_groups(rank)
    if ex.program.backend == "gloo":
        last = mine[-1]
        ranks = "[]" if last.style == NEW_GROUP else str(list(range(len(last.ranks))))
        if last.style == DEFAULT:
            ranks = str(list(last.ranks))
        return {"": {"name": "", "desc": "", "ranks": ranks}}
    return {g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(g.ranks))} for g in mine}


def _pg_status(ex: Execution, st: RankState, tv: float, pickle: bool) -> dict[str, Any]:
    layout = ex.program.layout
    out: dict[str, Any] = {}
    for g in layout.member_groups(st.rank):
        if not any(e.group == g.index and e.t_created <= tv for e in st.issued):
            continue  # torch adds a group's status at its first recorded op (FlightRecorder::record)
        uid = layout.uid(st.rank, g.index)
        if ex.program.backend == "gloo":
            # the op id of the last recorded entry (op ids count the unrecorded p2p ops too)
            mine = [e for e in st.issued if e.group == g.index and e.t_created <= tv]
            enq = max((e.op_id for e in mine), default=-1)
            comp = max((e.op_id for e in mine if ((d := e.done_at()) is not None and d <= tv)
                        or (st.status == FAILED and tv >= st.t)), default=-1)
            vals = (enq, -1, comp)
        else:
            mine = [e for e in st.issued if e.group == g.index and e.t_created <= tv and not e.p2p_name]
            enq = max((e.coll_seq for e in mine), default=-1)
            comp = max((e.coll_seq for e in mine if (d := e.done_at()) is not None and d <= tv), default=-1)
            started = max((e.coll_seq for e in mine if (s := _started(ex, st, e, tv)) is not None and s <= tv),
                          default=-1)
            vals = (enq, started, comp)
        keys = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")
        out[str(uid)] = {k: (v if pickle else str(v)) for k, v in zip(keys, vals, strict=True)}
    return out


def dump(ex: Execution, rank: int, tv: float, *, pickle: bool, version: str = "2.10",
         buffer: int = 2000) -> dict[str, Any]:
    """Rank `rank`'s recorder as read at time `tv` (seconds into the run)."""
    st = ex.states[rank]
    thread = str(139_700_000_000_000 + rank * 7_919_113)
    entries = [e for e in st.issued if e.t_created <= tv][-buffer:]
    rows = [_entry(ex, st, e, tv, pickle, version, thread) for e in entries]
    lib = "" if ex.program.backend == "gloo" else "2.21.5"
    if pickle:
        out: dict[str, Any] = {"version": version, "pg_config": _pg_config(ex, rank, True), "comm_lib_version": lib,
                               "pg_status": _pg_status(ex, st, tv, True), "entries": rows}
        return out
    return {"comm_lib_version": lib, "entries": rows, "nccl_comm_state": {}, "pg_config": _pg_config(ex, rank, False),
            "pg_status": _pg_status(ex, st, tv, False), "version": version}
