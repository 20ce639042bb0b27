"""A rank's own collective times (the bootstrap's `frscope_timings` handler), as the sidecar serves them
beside the recorder: the `timings` field of a snapshot piece.

The rank answers, and the piece carries, one JSON object:

    {"frscope_timings": 1, "mechanism": "pg_hooks" | "wrappers", "capacity": N, "aborted_at_ns": 0,
     "rows": [[group name, collective_seq_id, op_id, op, start_ns, end_ns], ...]}

`group name` and `collective_seq_id` are the recorder's (an entry's `process_group[0]` and
`collective_seq_id`): that is how a row finds its entry. `op_id` is -1 where torch did not say;
`end_ns` 0 while the collective runs, or where the host cannot see its end (a GPU collective). Times
are the rank's wall clock in ns, the recorder's own clock.

Readers take it as hostile: `parse_timings` keeps the rows that are well formed (at most
TIMINGS_MAX_ROWS) and counts the others; it never raises on a row.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from frscope.wire.common import WireError, read_int, read_text

TIMINGS_KEY = "frscope_timings"  # marks the document (the rank's answer) and names the handler
TIMINGS_PIECE_KEY = "timings"  # the snapshot piece's field that carries it
TIMINGS_FORMAT = 1
TIMINGS_MAX_ROWS = 100_000  # the bootstrap's ring is at most this long (FRSCOPE_TIMINGS_SIZE)
TIMINGS_MAX_BYTES = 16 * 1024 * 1024  # a full ring is ~70 bytes a row
_TIME_MIN = 10**17  # 1973: anything earlier is no wall clock in ns
_TIME_MAX = 1 << 62


class TimingRow(NamedTuple):
    """One collective as its rank dated it."""

    group: str
    seq: int
    op_id: int
    op: str
    start_ns: int
    end_ns: int | None  # None: not ended (yet), or not visible from the host

    @property
    def duration_ms(self) -> float | None:
        return None if self.end_ns is None else (self.end_ns - self.start_ns) / 1e6


class Timings(NamedTuple):
    mechanism: str
    rows: list[TimingRow]
    rejected: int  # rows left out as malformed
    aborted_at_ns: int | None


def _row(raw: Any) -> TimingRow | None:
    if not isinstance(raw, list) or len(raw) < 6:
        return None
    group, seq, op_id, op, start, end = raw[:6]
    seq, op_id, start, end = read_int(seq), read_int(op_id), read_int(start), read_int(end)
    if not isinstance(group, str) or not group or len(group) > 256 or not isinstance(op, str):
        return None
    if seq is None or seq < 0 or op_id is None or start is None or not _TIME_MIN <= start <= _TIME_MAX:
        return None
    if end == 0:
        return TimingRow(group, seq, op_id, op[:64], start, None)
    if end is None or not start <= end <= _TIME_MAX:
        return None
    return TimingRow(group, seq, op_id, op[:64], start, end)


def parse_timings(obj: Any) -> Timings:
    """A timings document, decoded -> its good rows. WireError only when it is no timings document."""
    if not isinstance(obj, dict) or obj.get(TIMINGS_KEY) != TIMINGS_FORMAT:
        raise WireError(f"timings: not a {TIMINGS_KEY} {TIMINGS_FORMAT} object")
    raw_rows = obj.get("rows")
    if not isinstance(raw_rows, list):
        raise WireError("timings: 'rows' is not a list")
    rows: list[TimingRow] = []
    rejected = max(0, len(raw_rows) - TIMINGS_MAX_ROWS)
    for raw in raw_rows[-TIMINGS_MAX_ROWS:]:
        row = _row(raw)
        if row is None:
            rejected += 1
        else:
            rows.append(row)
    aborted = read_int(obj.get("aborted_at_ns"))
    return Timings(read_text(obj.get("mechanism"), 40), rows, rejected, aborted if aborted else None)


def loads_timings(raw: bytes) -> Timings:
    """A rank's `frscope_timings` answer -> its rows. WireError if it is too large or not one."""
    if len(raw) > TIMINGS_MAX_BYTES:
        raise WireError(f"timings: {len(raw)} bytes, more than {TIMINGS_MAX_BYTES}")
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise WireError(f"timings: not JSON: {exc}") from exc
    return parse_timings(obj)


def timings_document(timings: Timings, last: int | None = None) -> dict[str, Any]:
    """The document again (what the sidecar puts in a piece), its newest `last` rows where given."""
    rows = timings.rows if last is None or last >= len(timings.rows) else timings.rows[-last:] if last > 0 else []
    return {TIMINGS_KEY: TIMINGS_FORMAT, "mechanism": timings.mechanism, "aborted_at_ns": timings.aborted_at_ns or 0,
            "rows": [[r.group, r.seq, r.op_id, r.op, r.start_ns, r.end_ns or 0] for r in rows]}


def window_timings(piece: dict[str, Any], last: int) -> bool:
    """Cut a decoded piece's timings to the newest `last` rows in place (the window of `window_piece`:
    a rank dates its collectives in the order it issues them, as its recorder lists them)."""
    doc = piece.get(TIMINGS_PIECE_KEY)
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if last <= 0 or not isinstance(rows, list) or len(rows) <= last:
        return False
    doc["rows"] = rows[-last:]  # type: ignore[index]
    return True
