"""One rank's `fr_trace_json` answer -> what a poll learns from it (a `Digest`), in a worker thread.

The answer is decoded in pieces (`loads_in_pieces`) so the event loop's thread gets the GIL back
between entries, normalized by frscope.records, and counted against the rank's watermarks (which
collectives and durations the metrics have already seen).
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Any

from frscope import wire
from frscope.analysis import op_label
from frscope.records import DumpError, normalize_dump
from frscope.records.timings import apply_rows
from frscope.sidecar.client import WorkerError
from frscope.sidecar.progress import GroupSample, sample_groups
from frscope.sidecar.ranks import RankState


@dataclass(slots=True)
class Digest:
    """What one poll of one rank yields, computed in a worker thread."""

    raw_hash: bytes
    raw_z: bytes | None  # None: unchanged since the last poll
    samples: dict[str, GroupSample] | None
    new_ops: list[tuple[str, str]]
    durations: list[tuple[str, float]]
    count_watermark: int
    duration_watermark: int
    info: dict[str, str]
    timed: bool  # the recorder dates collectives' durations (NCCL with timing, or the rank's own times)
    timings_json: bytes | None = None  # the rank's own times as a piece's `timings` (frscope.wire.timings)
    timings_problem: str | None = None  # why the rank's answer to frscope_timings was not used


_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def loads_in_pieces(raw: bytes) -> Any:
    """json.loads for a top-level object whose big values are lists (`entries`), decoding each list
    element on its own. json.loads is one C call that holds the GIL for the whole document (tens of ms
    for a 2,000-entry recorder); between elements the event loop's thread gets the GIL back, so
    /metrics answers while a recorder is parsed. Same result as json.loads; ValueError if invalid."""
    text = raw.decode("utf-8")
    ws, decode = _WS.match, _DECODER.raw_decode

    def skip(i: int) -> int:
        m = ws(text, i)
        return m.end() if m else i

    def expect(i: int, char: str) -> int:
        if text[i:i + 1] != char:
            raise ValueError(f"expected {char!r} at byte {i}")
        return i + 1

    i = expect(skip(0), "{")
    out: dict[str, Any] = {}
    i = skip(i)
    if text[i:i + 1] == "}":
        i += 1
    else:
        while True:
            key, i = decode(text, i)
            if not isinstance(key, str):
                raise ValueError(f"object key at byte {i} is not a string")
            i = skip(expect(skip(i), ":"))
            if text[i:i + 1] == "[":
                items: list[Any] = []
                i = skip(i + 1)
                if text[i:i + 1] == "]":
                    i += 1
                else:
                    while True:
                        item, i = decode(text, i)
                        items.append(item)
                        i = skip(i)
                        if text[i:i + 1] == ",":
                            i = skip(i + 1)
                            continue
                        i = expect(i, "]")
                        break
                value: Any = items
            else:
                value, i = decode(text, i)
            out[key] = value
            i = skip(i)
            if text[i:i + 1] == ",":
                i = skip(i + 1)
                continue
            i = expect(i, "}")
            break
    if skip(i) != len(text):
        raise ValueError(f"extra data at byte {skip(i)}")
    return out


def read_timings(raw: bytes | None) -> tuple[wire.Timings | None, bytes | None, str | None]:
    """A rank's frscope_timings answer -> (its rows, the piece's `timings` JSON, why it is unusable)."""
    if raw is None:
        return None, None, None
    try:
        timings = wire.loads_timings(raw)
    except wire.WireError as exc:
        return None, None, str(exc)
    doc = json.dumps(wire.timings_document(timings), separators=(",", ":")).encode()
    problem = f"frscope_timings: {timings.rejected} malformed row(s) left out" if timings.rejected else None
    return timings, doc, problem


def digest(raw_z: bytes, raw_hash: bytes, rank: int, source: str, previous: RankState,
           timings_raw: bytes | None = None) -> Digest:
    """Parse and normalize one fr_trace_json answer, given compressed, with the rank's own collective
    times where it dates them (`timings_raw`, its frscope_timings answer) put on the entries they
    belong to (worker thread). Raises WorkerError."""
    timings, timings_json, problem = read_timings(timings_raw)
    if raw_hash == previous.raw_hash:
        return Digest(raw_hash, None, None, [], [], previous.count_watermark, previous.duration_watermark,
                      previous.info, previous.timed, timings_json, problem)
    raw = zlib.decompress(raw_z)
    try:
        obj = loads_in_pieces(raw) if raw.lstrip()[:1] == b"{" else json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise WorkerError("decode", f"{source}: fr_trace_json: not JSON: {exc}") from exc
    if timings is not None and isinstance(obj, dict):
        apply_rows(obj, timings)
    try:
        dump = normalize_dump(obj, source, rank)
    except DumpError as exc:
        raise WorkerError("malformed", f"{source}: fr_trace_json: {exc.message}") from exc
    del obj
    dump.rank = rank  # the socket name is the truth for a live rank
    samples = sample_groups(dump)
    entries = dump.entries
    top = max((e.record_id for e in entries), default=-1)
    count_wm = previous.count_watermark
    duration_wm = previous.duration_watermark
    if top < count_wm:  # a new process behind the same socket: record ids start again
        count_wm = duration_wm = -1
    new_ops: list[tuple[str, str]] = []
    durations: list[tuple[str, float]] = []
    advancing = True
    timed = False
    for entry in entries:
        rid = entry.record_id
        timed = timed or entry.duration_ms is not None
        if rid > count_wm:
            new_ops.append((entry.pg_name, op_label(entry.op)))
        if advancing and rid > duration_wm:
            if entry.completed or entry.duration_ms is not None:
                if entry.duration_ms is not None:
                    durations.append((op_label(entry.op), entry.duration_ms / 1000.0))
                duration_wm = rid
            else:
                advancing = False
    info = {
        "backend": dump.backend or "unknown",
        "recorder_version": dump.version or "unknown",
        "comm_lib_version": dump.comm_lib_version or "unknown",
        "torch_version": str(previous.meta.get("torch_version") or "unknown"),
    }
    return Digest(raw_hash, raw_z, samples, new_ops, durations, max(count_wm, top), duration_wm, info, timed,
                  timings_json, problem)
