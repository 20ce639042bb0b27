"""A rank's own collective times (a snapshot piece's `timings`, frscope.wire.timings) put on its
recorder's entries, before they are normalized.

The recorder dates collectives only where the backend does (NCCL: `time_discovered_started_ns`,
`time_discovered_completed_ns`, and `duration_ms` with timing); gloo's entries have their creation
time alone. The bootstrap's hooks date every collective on the rank itself; each row finds its entry
by (group name, collective_seq_id) and fills the times the entry lacks: the start, and where the
row has an end, the completion and `duration_ms`. What the recorder dated itself is never replaced,
and nothing else changes: whether a collective completed is still the recorder's word (`state`,
`retired`), never the row's. P2P entries are keyed by op_id in the recorder, and are not dated here.
"""

from __future__ import annotations

from typing import Any

from frscope import wire


def apply_timings(trace: dict[str, Any], doc: Any) -> str | None:
    """Fill `trace`'s raw entries (in place) from the timings document `doc`. Returns a warning for the
    dump when the document is unusable or partly malformed, else None."""
    try:
        timings = wire.parse_timings(doc)
    except wire.WireError as exc:
        return f"{exc}; its collectives are not dated by the rank"
    return apply_rows(trace, timings)


def apply_rows(trace: dict[str, Any], timings: wire.Timings) -> str | None:
    """`apply_timings` for a document already parsed."""
    entries = trace.get("entries")
    if not isinstance(entries, list) or not timings.rows:
        return _rejected(timings.rejected)
    by_key = {(row.group, row.seq): row for row in timings.rows}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("is_p2p") is True:
            continue
        group = entry.get("process_group")
        seq = entry.get("collective_seq_id")
        if not isinstance(group, (list, tuple)) or not group or not isinstance(seq, int) or isinstance(seq, bool):
            continue
        name = group[0]
        row = by_key.get((name, seq)) if isinstance(name, str) else None
        if row is None:
            continue
        # The rank's start is taken just before the backend records the entry: never before the
        # entry's own creation (started >= created, as the recorder's own times are).
        created = entry.get("time_created_ns")
        start = max(row.start_ns, created) if isinstance(created, int) and created <= (row.end_ns or created) \
            else row.start_ns
        if not entry.get("time_discovered_started_ns"):
            entry["time_discovered_started_ns"] = start
        if row.end_ns is None or entry.get("time_discovered_completed_ns") or entry.get("duration_ms") is not None:
            continue
        if entry.get("state") == "completed" or entry.get("retired") is True:
            # Only a collective the recorder itself counts as done: a row's end never turns a hang
            # into a completion, and a row read a moment before the recorder waits for the next read.
            entry["time_discovered_completed_ns"] = row.end_ns
            entry["duration_ms"] = (row.end_ns - start) / 1e6
    return _rejected(timings.rejected)


def _rejected(count: int) -> str | None:
    return f"timings: {count} malformed row(s) left out" if count else None
