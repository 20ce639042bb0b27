"""DumpSet -> Chrome / Perfetto trace JSON (`frscope analyze --trace FILE`), for the people who live in
ui.perfetto.dev or chrome://tracing.

The Trace Event Format's JSON object form: one *process* per rank ("rank 3"), one *thread* per process
group on that rank ("pg 0 (default_pg)"), and each recorder entry a complete slice (`ph: "X"`) named
after its op and sequence id, with the entry's fields in `args` (seq, op, sizes, dtypes, state...).

Where a slice ends:
- the recorder's completion time, or its start (or creation) plus `duration_ms` (NCCL with timing);
- not finished when the recorder was read: the capture time. That is the wait a hang is made of, and
  the slice says `"in_flight_at_capture": true`;
- finished but with no end recorded (gloo records none): an instant (`ph: "i"`), not a made-up length.

Slices on one thread must nest, and a group can have several collectives in flight at once (async
ops, coalesced batches): such overlaps go to extra lanes, threads named "pg 0 (default_pg) lane 2".
Times are microseconds since the earliest entry (`otherData.t0_ns` says when that was, ns since the
epoch); ranks on different hosts carry their hosts' clock skew.
"""

from __future__ import annotations

from typing import Any

from frscope.records import DumpSet, Entry

TRACE_SCHEMA = "frscope.trace/v1"
# Threads of one rank: group index * LANES + lane (a group with more overlapping lanes shares the last).
LANES = 64


def _end_ns(entry: Entry, captured_ns: int | None) -> tuple[int | None, bool]:
    """(when the entry's slice ends, whether it was still in flight when the recorder was read)."""
    begin = entry.time_started_ns or entry.time_created_ns
    if entry.time_completed_ns:
        return entry.time_completed_ns, False
    if entry.duration_ms is not None and begin is not None:
        return begin + int(entry.duration_ms * 1e6), False
    if not entry.completed and captured_ns is not None and begin is not None and captured_ns > begin:
        return captured_ns, True
    return None, False


def _args(entry: Entry, state: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": entry.p2p_seq_id if entry.is_p2p else entry.collective_seq_id,
        "op": entry.op,
        "pg": entry.pg_name,
        "pg_desc": entry.pg_desc,
        "state": state,
        "record_id": entry.record_id,
        "input_sizes": entry.input_sizes,
        "output_sizes": entry.output_sizes,
        "input_dtypes": entry.input_dtypes,
        "output_dtypes": entry.output_dtypes,
    }
    if entry.is_p2p:
        out["p2p_peer"] = entry.peer
    if entry.duration_ms is not None:
        out["duration_ms"] = entry.duration_ms
    if entry.timeout_ms:
        out["timeout_ms"] = entry.timeout_ms
    return out


def _state(entry: Entry, in_flight: bool) -> str:
    if in_flight:
        return "in flight at capture"
    if entry.completed:
        return "completed"
    return entry.state


def build_trace(dumpset: DumpSet) -> dict[str, Any]:
    """The trace as a JSON-able dict (`json.dump` it)."""
    starts = [e.time_created_ns for d in dumpset.dumps.values() for e in d.entries if e.time_created_ns]
    t0 = min(starts, default=0)
    group_index = {name: i for i, name in enumerate(sorted(dumpset.groups, key=lambda n: (len(n), n)))}
    events: list[dict[str, Any]] = []

    def us(ns: int) -> float:
        return round((ns - t0) / 1000.0, 3)

    for rank in sorted(dumpset.dumps):
        dump = dumpset.dumps[rank]
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        lanes: dict[str, list[int]] = {}  # group -> each lane's last end (ns)
        named: set[int] = set()
        for entry in sorted(dump.entries, key=lambda e: (e.time_created_ns or 0, e.record_id)):
            begin = entry.time_started_ns or entry.time_created_ns
            if begin is None:
                continue
            gi = group_index.setdefault(entry.pg_name, len(group_index))
            end, in_flight = _end_ns(entry, dump.captured_at_ns)
            ends = lanes.setdefault(entry.pg_name, [])
            lane = next((i for i, last in enumerate(ends) if last <= begin), len(ends))
            lane = min(lane, LANES - 1)
            if lane == len(ends):
                ends.append(end or begin)
            else:
                ends[lane] = max(ends[lane], end or begin)
            tid = gi * LANES + lane
            if tid not in named:
                named.add(tid)
                label = f"pg {entry.pg_name}" + (f" ({entry.pg_desc})" if entry.pg_desc else "")
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                               "args": {"name": label + (f" lane {lane + 1}" if lane else "")}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                               "args": {"sort_index": tid}})
            seq = entry.p2p_seq_id if entry.is_p2p else entry.collective_seq_id
            event: dict[str, Any] = {
                "name": f"{entry.op} #{seq}", "cat": "p2p" if entry.is_p2p else "collective",
                "pid": rank, "tid": tid, "ts": us(begin), "args": _args(entry, _state(entry, in_flight)),
            }
            if end is not None and end >= begin:
                event["ph"] = "X"
                event["dur"] = round((end - begin) / 1000.0, 3)
                if in_flight:
                    event["args"]["in_flight_at_capture"] = True
            else:
                event["ph"] = "i"
                event["s"] = "t"
            events.append(event)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"schema": TRACE_SCHEMA, "t0_ns": str(t0), "world_size": dumpset.world_size},
    }


MAX_TIMELINE_EVENTS = 300_000


def _dense_cells(group: dict[str, Any], row: int) -> list[int]:
    cells = list(group["col_cell"])
    runs = group["patterns"][group["row_pattern"][row]]
    for i in range(0, len(runs) - 2, 3):
        cells[runs[i] : runs[i] + runs[i + 1]] = [runs[i + 2]] * runs[i + 1]
    return cells


def _expand(row: list[Any] | None, width: int) -> list[Any]:
    out: list[Any] = []
    for v in row or ():
        if isinstance(v, list):
            out.extend([v[0]] * v[1])
        else:
            out.append(v)
    return out if row is not None else [None] * width


def trace_from_timeline(timeline: dict[str, Any], max_events: int = MAX_TIMELINE_EVENTS) -> dict[str, Any]:
    """The same trace from timeline data (frscope.report.timeline), for whoever keeps the timeline and not
    the recorders (the operator's web UI: `GET .../trace.json`). Each rank's own times where the timeline
    kept them (`rank_times`: the most recent collectives), else the group's median creation time and
    duration, marked `"times": "group median"`. At most `max_events` slices, the most recent kept."""
    t0 = int(timeline.get("t0_ns") or 0)
    strings, cells, states = timeline["strings"], timeline["cells"], timeline["states"]
    op_names, captured = timeline["op_names"], timeline.get("captured_ms") or {}
    events: list[dict[str, Any]] = []
    meta: list[dict[str, Any]] = []
    named: set[tuple[int, int]] = set()
    budget = max_events
    for gi, group in enumerate(timeline["groups"]):
        ranks, seqs = group["ranks"], group["seqs"]
        times = group.get("rank_times")
        first = times["first_col"] if times else max(0, len(seqs) - max(1, budget // max(1, len(ranks))))
        if budget <= 0 or not ranks or not seqs:
            continue
        first = max(first, len(seqs) - max(1, budget // len(ranks)))
        width = len(seqs) - first
        for row, rank in enumerate(ranks):
            dense = _dense_cells(group, row)
            own_c = _expand(times["created_us"][row] if times and times["created_us"] else None, width)
            own_q = _expand(times["queued_us"][row] if times and times["queued_us"] else None, width)
            own_d = _expand(times["dur_us"][row] if times and times["dur_us"] else None, width)
            skip = (times["first_col"] if times else first)
            ends: list[float] = []
            for col in range(first, len(seqs)):
                cell_id = dense[col]
                median_ms = group["col_t_ms"][col]
                if cell_id < 0 or median_ms is None:
                    continue
                cell = cells[cell_id]
                if cell[0] < 0:
                    continue  # nothing recorded by this rank here
                k = col - skip
                created_us = own_c[k] if 0 <= k < len(own_c) else None
                own = created_us is not None
                begin = median_ms * 1000 + (created_us or 0)
                if own and own_q[k] is not None:
                    begin += own_q[k]
                dur = own_d[k] if own and own_d[k] is not None else None
                if dur is None and not own and group["col_dur_ms"][col] is not None:
                    dur = group["col_dur_ms"][col] * 1000
                state = states[cell[1]]
                if dur is None and state == "in_flight" and str(rank) in captured:
                    dur = max(0.0, captured[str(rank)] * 1000 - begin)
                lane = next((i for i, last in enumerate(ends) if last <= begin), len(ends))
                lane = min(lane, LANES - 1)
                end = begin + (dur or 0)
                if lane == len(ends):
                    ends.append(end)
                else:
                    ends[lane] = max(ends[lane], end)
                tid = gi * LANES + lane
                if (rank, tid) not in named:
                    named.add((rank, tid))
                    label = f"pg {group['name']}" + (f" ({group['desc']})" if group.get("desc") else "")
                    meta.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                                 "args": {"name": label + (f" lane {lane + 1}" if lane else "")}})
                op = op_names[cell[0]]
                event: dict[str, Any] = {
                    "name": f"{op} #{seqs[col]}", "cat": "collective", "pid": rank, "tid": tid, "ts": round(begin, 3),
                    "args": {"seq": seqs[col], "op": op, "pg": group["name"], "pg_desc": group.get("desc"),
                             "state": state, "input_sizes": strings[cell[2]], "input_dtypes": strings[cell[3]],
                             "output_sizes": strings[cell[4]], "output_dtypes": strings[cell[5]],
                             "times": "this rank" if own else "group median"},
                }
                if dur is not None:
                    event["ph"], event["dur"] = "X", round(dur, 3)
                    if state == "in_flight":
                        event["args"]["in_flight_at_capture"] = True
                else:
                    event["ph"], event["s"] = "i", "t"
                events.append(event)
                budget -= 1
    ranks_seen = sorted({e["pid"] for e in events})
    for rank in ranks_seen:
        meta.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {"schema": TRACE_SCHEMA, "t0_ns": str(t0), "world_size": timeline.get("world_size"),
                      "source": "timeline"},
    }
