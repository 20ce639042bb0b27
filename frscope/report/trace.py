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
