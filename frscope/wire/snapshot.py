"""The snapshot piece (one rank's recorder with its capture metadata) and the snapshot envelope (a
pod's pieces plus per-rank errors), the snapshot window (`/v1/snapshot?entries=N`), and the answer's
validator (its ETag, for `If-None-Match`)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from frscope.wire.common import (
    ENTRIES_DROPPED_KEY,
    ETAG_MAX_CHARS,
    IF_NONE_MATCH_MAX_CHARS,
    IF_NONE_MATCH_MAX_TAGS,
    SNAPSHOT_FORMAT,
    SNAPSHOT_KEY,
    SNAPSHOT_SCHEMA,
    SNAPSHOT_WINDOW_MAX,
    SNAPSHOT_WINDOW_MIN,
    WireError,
    read_int,
)
from frscope.wire.timings import TIMINGS_PIECE_KEY, window_timings

# -- the snapshot piece (one rank) -------------------------------------------------------------------


def snapshot_piece(rank: int, captured_at_ns: int, source: str, stacks: str | None, trace: Any) -> dict[str, Any]:
    """One rank's snapshot piece as a JSON-ready dict; `trace` is the recorder as torch wrote it."""
    return {
        SNAPSHOT_KEY: SNAPSHOT_FORMAT,
        "rank": rank,
        "captured_at_ns": captured_at_ns,
        "source": source,
        "stacks": stacks,
        "trace": trace,
    }


def snapshot_piece_bytes(rank: int, captured_at_ns: int, source: str, stacks: str | None,
                         trace_json: bytes, timings_json: bytes | None = None) -> bytes:
    """The same piece as JSON bytes, `trace_json` spliced in as is (never decoded again: the sidecar
    keeps recorders as the bytes torch answered). `timings_json`: the rank's own collective times
    (`frscope.wire.timings`), the piece's `timings` field, where the rank dates them."""
    head = snapshot_piece(rank, captured_at_ns, source, stacks, None)
    del head["trace"]
    timings = b', "' + TIMINGS_PIECE_KEY.encode() + b'": ' + timings_json if timings_json else b""
    return json.dumps(head)[:-1].encode() + timings + b', "trace": ' + trace_json + b"}"


def is_snapshot_piece(raw: Any) -> bool:
    return isinstance(raw, dict) and SNAPSHOT_KEY in raw and "trace" in raw


def unwrap_snapshot(raw: Any) -> tuple[Any, dict[str, Any]]:
    """(recorder, capture metadata): frscope's snapshot pieces wrap the recorder; torch's dumps do not."""
    if is_snapshot_piece(raw):
        meta = {k: v for k, v in raw.items() if k != "trace"}
        return raw["trace"], meta
    return raw, {}


def parse_window(text: str | None) -> int | None:
    """The `entries` query parameter of `/v1/snapshot`: None when absent, else an int in
    [SNAPSHOT_WINDOW_MIN, SNAPSHOT_WINDOW_MAX]. WireError (the sidecar answers 400 with its message)
    for anything else."""
    if text is None:
        return None
    value = text.strip()
    digits = value.isascii() and value.isdigit() and len(value) <= 7
    if not digits or not SNAPSHOT_WINDOW_MIN <= int(value) <= SNAPSHOT_WINDOW_MAX:
        raise WireError(f"entries must be an integer from {SNAPSHOT_WINDOW_MIN} to {SNAPSHOT_WINDOW_MAX:,} "
                        f"(the newest entries kept per rank), not {text[:40]!r}")
    return int(value)


def window_query(entries: int | None) -> str | None:
    """The `entries` query value a reader sends for a window of `entries` (None or 0: the whole ring).
    A window past the bounds is clamped into them, so that a reader never asks what a sidecar refuses."""
    if not entries or entries <= 0:
        return None
    return str(min(max(entries, SNAPSHOT_WINDOW_MIN), SNAPSHOT_WINDOW_MAX))


def window_piece(piece: dict[str, Any], last: int) -> bool:
    """Cut a decoded snapshot piece (or a bare recorder) to its newest `last` entries in place, adding
    what it leaves out to the piece's `entries_dropped`. The sidecar does it for `?entries=N`; the
    operator does it again to whatever arrives (a sidecar that predates the window sends everything),
    before normalizing. False when nothing was cut."""
    trace = piece.get("trace") if is_snapshot_piece(piece) else piece
    if last <= 0 or not isinstance(trace, dict):
        return False
    entries = trace.get("entries")
    if not isinstance(entries, list) or len(entries) <= last:
        return False
    trace["entries"] = entries[-last:]
    piece[ENTRIES_DROPPED_KEY] = entries_dropped(piece) + len(entries) - last
    window_timings(piece, last)
    return True


def entries_dropped(piece: dict[str, Any]) -> int:
    """What a windowed piece says it left out (0 when it says nothing or nonsense)."""
    value = piece.get(ENTRIES_DROPPED_KEY)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62:
        return value
    return 0


# -- the answer's validator (conditional requests) ---------------------------------------------------
#
# A sidecar serves what it read at its last full poll (every 30 s by default) to every request in between:
# each `/v1/snapshot` answer carries an ETag naming what it holds (its ranks' evidence and errors, the
# window asked, the content coding), and a request whose If-None-Match names it is answered 304 Not
# Modified, with no body. The tag is weak (`W/`): the envelope's head (`captured_at_ns`, the sidecar's
# latest poll round) may differ between two answers of one tag; its ranks and errors do not. A reader
# compares a tag only with the one the same sidecar gave it before, never reads anything into it.

_ETAG = re.compile(r'(?:W/)?"[\x21\x23-\x7e]*"')


def snapshot_etag(parts: Iterable[object], *, gzip: bool) -> str:
    """The weak ETag of an answer made of `parts` (ints, strings, bytes, None: what identifies each rank's
    evidence), in the content coding asked (gzip or not: two representations, two tags)."""
    hasher = hashlib.blake2b(digest_size=16)
    for part in parts:
        hasher.update(part if isinstance(part, bytes) else repr(part).encode())
        hasher.update(b"\x00")
    return f'W/"{hasher.hexdigest()}{"-gzip" if gzip else ""}"'


def read_etag(value: str | None) -> str | None:
    """An answer's ETag as a reader keeps it: an entity tag of at most ETAG_MAX_CHARS visible ASCII
    characters; None for anything else (the next request is then not conditional)."""
    if value is None or len(value) > ETAG_MAX_CHARS:
        return None
    value = value.strip()
    return value if _ETAG.fullmatch(value) else None


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names `etag` (RFC 9110's weak comparison: `W/` aside, the same
    opaque tag; `*` names any). A header longer than IF_NONE_MATCH_MAX_CHARS, or of more than
    IF_NONE_MATCH_MAX_TAGS tags, names nothing: the answer is sent whole."""
    if not if_none_match or len(if_none_match) > IF_NONE_MATCH_MAX_CHARS:
        return False
    if if_none_match.strip() == "*":
        return True
    tags = if_none_match.split(",")
    if len(tags) > IF_NONE_MATCH_MAX_TAGS:
        return False
    opaque = etag.removeprefix("W/")
    return any(tag.strip().removeprefix("W/") == opaque for tag in tags)


# -- the snapshot envelope (one pod) -----------------------------------------------------------------


class SnapshotError(TypedDict):
    """A rank the envelope has no piece for, and why (rank None: not tied to one rank)."""

    rank: int | None
    message: str


def snapshot_head(*, pod: str, namespace: str, node: str, captured_at_ns: int, reason: str) -> dict[str, Any]:
    """The envelope's fields before `ranks` and `errors` (`reason`: poll, stall, refresh, dump, exit)."""
    return {
        "schema": SNAPSHOT_SCHEMA,
        "pod": pod,
        "namespace": namespace,
        "node": node,
        "captured_at_ns": captured_at_ns,
        "reason": reason,
    }


def snapshot_envelope_bytes(head: dict[str, Any], pieces: list[bytes], errors: list[SnapshotError]) -> bytes:
    """The envelope as JSON bytes: `head`, then the pieces (JSON bytes, spliced in), then the errors."""
    return (
        json.dumps(head)[:-1].encode()
        + b', "ranks": [' + b",".join(pieces) + b'], "errors": ' + json.dumps(errors).encode() + b"}"
    )


def is_snapshot_envelope(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("schema") == SNAPSHOT_SCHEMA


@dataclass(slots=True)
class SidecarSnapshot:
    """One pod's snapshot envelope, read. `ranks` are snapshot pieces, undecoded further."""

    pod: str
    namespace: str
    captured_at_ns: int | None
    reason: str
    ranks: list[dict[str, Any]]
    errors: list[tuple[int | None, str]] = field(default_factory=list)
    size_bytes: int = 0


def parse_snapshot(obj: Any, size_bytes: int = 0) -> SidecarSnapshot:
    """Validate the envelope (each piece is checked later, by frscope.records). WireError if not one."""
    if not is_snapshot_envelope(obj):
        raise WireError(f"snapshot: not a {SNAPSHOT_SCHEMA} object")
    ranks = obj.get("ranks")
    if not isinstance(ranks, list):
        raise WireError("snapshot: 'ranks' is not a list")
    raw_errors = obj.get("errors") or []
    if not isinstance(raw_errors, list):
        raise WireError("snapshot: 'errors' is not a list")
    errors: list[tuple[int | None, str]] = []
    for err in raw_errors:
        if isinstance(err, dict):
            errors.append((read_int(err.get("rank")), str(err.get("message") or "")[:500]))
    return SidecarSnapshot(
        pod=str(obj.get("pod") or ""), namespace=str(obj.get("namespace") or ""),
        captured_at_ns=read_int(obj.get("captured_at_ns")), reason=str(obj.get("reason") or ""),
        ranks=[r for r in ranks if isinstance(r, dict)], errors=errors, size_bytes=size_bytes,
    )
