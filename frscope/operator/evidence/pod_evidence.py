"""One pod's evidence: its sidecar's snapshot body, decoded and normalized right away.

A 1,024-rank job's whole recorders are ~1 GiB of JSON (2,000 entries per rank): the operator asks the
sidecars for the newest `max_entries` entries of each rank only (`/v1/snapshot?entries=N`) and never
holds bodies as raw dicts. Each body is decoded as soon as it arrives, in a decode worker; each rank
is cut to its newest `max_entries` entries (again: a sidecar that predates the window, or a push,
sends the whole ring) before it is normalized (`frscope.records.normalize_dump`) into columns (an
`EntryTable`, ~30 KiB a rank of 200 entries), which is all that travels back and is kept. A hang is
decided by the newest collectives of every group; the ring buffer is already a window.
"""

from __future__ import annotations

import array
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from frscope.operator.evidence.group_lists import Packed
from frscope.operator.evidence.sidecars import DEFAULT_MAX_SNAPSHOT_BYTES, SidecarError, gunzip_capped, parse_snapshot
from frscope.records import LoadProblem, RankDump, scan
from frscope.records.envelope import envelope_problems, piece_dump
from frscope.records.limits import MIN_JSON_BYTES_PER_CONTAINER, describe
from frscope.records.normalize import parse_profiling_name
from frscope.wire import ENTRIES_DROPPED_KEY, SidecarSnapshot, entries_dropped, window_piece

DEFAULT_MAX_ENTRIES = 200

# What one body may cost before anything is built from it. A gzip body may inflate to at most
# MAX_EXPANSION times its size plus EXPANSION_FLOOR (real snapshots compress 5-20x; 4 KiB of gzip can
# hold 4 MiB of `{}`); a body, else each rank piece, may hold at most one JSON object/array per
# MIN_JSON_BYTES_PER_CONTAINER bytes (real snapshots: ~80), which bounds the decoded objects to ~25x the
# inflated size (a piece past it is that rank's problem); and a pod's body at most MAX_PIECES rank
# pieces and errors (a pod hosts a node's ranks: 8-64, not a million).
MAX_EXPANSION = 64
EXPANSION_FLOOR = 1024 * 1024
MAX_PIECES = 1024
# A rank's thread stacks (torch's `dump_traceback` text) kept, at most: a trainer's threads' stacks are
# tens of KiB; past this the head is kept (the main thread comes first) and the rank says what was cut.
MAX_STACKS_CHARS = 256 * 1024


@dataclass(slots=True)
class PodEvidence:
    namespace: str
    pod: str
    reason: str
    captured_at_ns: int | None
    dumps: list[RankDump] = field(default_factory=list)
    problems: list[LoadProblem] = field(default_factory=list)
    entries_dropped: int = 0  # older entries left out, by the sidecar's window or by this operator
    size_bytes: int = 0
    cut_here: int = 0  # of those, the ones that were in the body (cut by this operator)
    # The pushing pod's uid, when its token says so (--sidecar-auth kubernetes): a job's pods keep their
    # names across a restart, so a push from a pod that is gone is told from its successor by uid.
    pod_uid: str = ""
    # What the decoded evidence keeps in memory (its tables, stacks, groups: `kept_bytes`), measured
    # where it was decoded; 0: not measured (then `held_bytes` falls back on the body's size).
    measured_bytes: int = 0
    # In transit from a decoder process only: its large group rank lists as digests (`group_lists`).
    packed_groups: Packed | None = None
    # What the body held (`push_decode.body_digest`), when decoded from a file; `unchanged`: not decoded,
    # the body was the one of that digest the caller decoded before (`decode_file(unchanged_if=...)`).
    digest: bytes = b""
    unchanged: bool = False
    # The ETag its sidecar gave this answer, and whom it was asked of (`validated_by`: the pod's uid and
    # endpoint): sent back as If-None-Match to that same sidecar only, and compared for equality only.
    etag: str = ""
    validated_by: str = ""

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(d.rank for d in self.dumps)

    @property
    def held_bytes(self) -> int:
        """What this evidence keeps in memory, as measured when it was decoded (every table, stack and
        group: `kept_bytes`), else the body's size (an upper bound for a body nothing was cut from)."""
        return self.measured_bytes if self.measured_bytes > 0 else max(1, self.size_bytes)


def kept_bytes(dumps: list[RankDump], problems: list[LoadProblem]) -> int:
    """The memory the decoded evidence keeps: each rank's table columns, its stacks and its groups,
    and the problems' text, measured object by object (shared objects counted once)."""
    seen: set[int] = set()
    total = 0
    stack: list[Any] = [*dumps, *problems]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (bool, int, float)) and -5 <= obj <= 256:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, (str, bytes, bytearray, array.array, int, float)):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        else:
            for name in getattr(type(obj), "__slots__", ()) or ():
                stack.append(getattr(obj, name, None))
            if hasattr(obj, "__dict__"):
                stack.extend(vars(obj).values())
    return total


def _cap_stacks(dump: RankDump) -> None:
    if dump.stacks is not None and len(dump.stacks) > MAX_STACKS_CHARS:
        cut = len(dump.stacks) - MAX_STACKS_CHARS
        dump.stacks = dump.stacks[:MAX_STACKS_CHARS]
        dump.warnings.append(f"its thread stacks were cut to their first {MAX_STACKS_CHARS} characters "
                             f"({cut} left out)")


def from_snapshot(snapshot: SidecarSnapshot, *, origin: str, max_entries: int = DEFAULT_MAX_ENTRIES,
                  max_ranks: int = MAX_PIECES) -> PodEvidence:
    """A pod's snapshot -> its evidence, each rank read by `records.envelope` as the CLI reads an envelope,
    after its cut to the newest `max_entries` entries (frscope.wire's cut, the one the sidecar makes for
    ?entries=N: a sidecar that predates the window, or a push, sends the whole ring). Ranks go into
    columns: ~30 KiB a rank of 200 entries instead of ~150 as `Entry` objects (8,192 ranks: 1.2 GiB)."""
    where = f"pod {snapshot.namespace}/{snapshot.pod} ({origin})"
    out = PodEvidence(snapshot.namespace, snapshot.pod, snapshot.reason, snapshot.captured_at_ns,
                      size_bytes=snapshot.size_bytes)
    out.problems.extend(envelope_problems(snapshot.errors, where))
    for index, raw in enumerate(snapshot.ranks[:max_ranks]):
        add_piece(out, raw, index, where, max_entries)
    if len(snapshot.ranks) > max_ranks:
        out.problems.append(LoadProblem(where, f"{len(snapshot.ranks)} ranks in one pod's answer: only the first "
                                        f"{max_ranks} are kept here", kind="warning"))
    measure(out, origin)
    return out


def measure(out: PodEvidence, origin: str) -> None:
    """A push's kept evidence measured (`measured_bytes`, what the push store counts), where it was decoded.
    Only a push is held by the push store; a fetched snapshot is analyzed and dropped, and the walk over
    every object of its tables was half of a gather's decoding CPU (bench/RESULTS.md, "Operator")."""
    if origin == "push":
        out.measured_bytes = kept_bytes(out.dumps, out.problems)


def add_piece(out: PodEvidence, raw: dict[str, Any], index: int, where: str, max_entries: int) -> None:
    """One rank's decoded piece -> its dump in `out` (cut to `max_entries`, stacks capped), or a problem."""
    if isinstance(raw, Unreadable):
        out.problems.append(LoadProblem(where, raw.why))
        return
    before = entries_dropped(raw)
    prebuilt = None
    if isinstance(raw, scan.ScannedPiece):  # read by the scanner, cut to the window there (`_scanned_body`)
        prebuilt = raw.prebuilt
        if raw.cut:
            raw[ENTRIES_DROPPED_KEY] = before + raw.cut
    elif max_entries > 0:
        window_piece(raw, max_entries)
    got = piece_dump(raw, where, index, columnar=True, prebuilt=prebuilt)
    if isinstance(got, LoadProblem):
        out.problems.append(got)
        return
    dropped = entries_dropped(raw)
    out.entries_dropped += dropped
    out.cut_here += dropped - before
    _cap_stacks(got)
    out.dumps.append(got)


class Unreadable(dict[str, Any]):
    """Stands for one rank's piece that could not be decoded (kept in `ranks` so it is reported)."""

    def __init__(self, why: str) -> None:
        super().__init__()
        self.why = why


def _int_or_none(digits: str) -> int | None:
    # A number past int64 is junk in a recorder; int() of 5,000 digits would fail the whole body.
    return int(digits) if len(digits) <= 20 else None


def _no_constant(_name: str) -> None:
    return None  # NaN / Infinity: 'not recorded'


# Digits as b"1", anything else as b"0" (bytes.translate), and a run of 20 of them: a body without one has
# no int literal of more than 20 characters, so Python's own int parsing (no Python call per int) reads it
# as `_int_or_none` would. At 8,192 pods the hook was ~4% of a gather's CPU samples; the scan is memchr-fast.
DIGIT_MARKS = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))
LONG_DIGITS = b"1" * 20
_HOOKED = json.JSONDecoder(parse_int=_int_or_none, parse_constant=_no_constant)
_PLAIN = json.JSONDecoder(parse_constant=_no_constant)


def json_decoder(raw: bytes | str) -> json.JSONDecoder:
    """The decoder for `raw`: the plain one where no int literal can be past 20 characters."""
    if isinstance(raw, bytes) and raw.translate(DIGIT_MARKS).find(LONG_DIGITS) < 0:
        return _PLAIN
    return _HOOKED


def loads_json(raw: bytes | str) -> Any:
    """`json.loads` with the int and constant hooks (its bytes and BOM handling kept)."""
    if isinstance(raw, bytes):
        return json_decoder(raw).decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    if raw.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", raw, 0)
    return _HOOKED.decode(raw)


# A JSON string (the loop unrolled: a run of plain characters at a time, not one alternation a character),
# or a bracket.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def value_span(text: str, start: int) -> tuple[int, int]:
    """End and deepest nesting of the JSON array/object starting at `start`, by bracket matching
    (strings skipped)."""
    depth = deepest = 0
    for match in _TOKEN.finditer(text, start):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
            if depth == 0:
                return match.end(), deepest
    raise ValueError("unterminated value")


def _value_end(text: str, start: int) -> int:
    return value_span(text, start)[0]


# Deeper than this, a piece is not decoded (json's recursion would fail on it anyway).
MAX_PIECE_DEPTH = 256


def dense(text: str | bytes) -> bool:
    """More JSON objects/arrays than one per MIN_JSON_BYTES_PER_CONTAINER bytes (strings' brackets count
    too: an upper bound). Real snapshots have one per ~80 bytes; `{}` repeated, one per 3."""
    containers = text.count("{") + text.count("[") if isinstance(text, str) else text.count(b"{") + text.count(b"[")
    return containers * MIN_JSON_BYTES_PER_CONTAINER > len(text)


def _loads_rank_by_rank(raw: bytes, endpoint: str) -> Any:
    """The snapshot envelope with each rank decoded on its own: a rank too deep to decode, or made of
    too many tiny objects and arrays, becomes an `Unreadable` (reported as that rank's problem); the
    others are kept. More than MAX_PIECES pieces refuse the body before any more is decoded."""
    try:
        text = raw.decode("utf-8")
        head = text.find('"ranks"')
        start = text.index("[", head) if head >= 0 else -1
        if start < 0:
            raise ValueError("no 'ranks' array")
        ranks: list[Any] = []
        i = start + 1
        decoder = json_decoder(raw)
        ws = re.compile(r"[ \t\n\r,]*")
        while True:
            i = ws.match(text, i).end()  # type: ignore[union-attr]
            if text[i : i + 1] == "]":
                break
            if len(ranks) >= MAX_PIECES:
                raise SidecarError(endpoint, f"more than {MAX_PIECES} rank pieces in one pod's snapshot",
                                   retryable=False)
            if text[i : i + 1] in ("{", "["):
                end, deepest = value_span(text, i)
                why = ("is nested too deeply to decode" if deepest > MAX_PIECE_DEPTH
                       else "is made of tiny JSON objects and arrays: not a recorder" if dense(text[i:end])
                       else None)
                if why is not None:
                    ranks.append(Unreadable(f"a rank's snapshot ({end - i} bytes) {why}"))
                    i = end
                    continue
            try:
                value, i = decoder.raw_decode(text, i)
                ranks.append(value)
            except RecursionError:
                end = _value_end(text, i)
                ranks.append(Unreadable(f"a rank's snapshot ({end - i} bytes) is nested too deeply to decode"))
                i = end
        rest = text[:start] + "[]" + text[i + 1 :]
        if dense(rest):
            raise ValueError("the snapshot's other fields are made of tiny JSON objects and arrays")
        obj = loads_json(rest)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise SidecarError(endpoint, f"answer is not JSON: {describe(str(exc))}", retryable=False) from exc
    if isinstance(obj, dict):
        obj["ranks"] = ranks
    return obj


def _scanned_body(raw: bytes, max_entries: int) -> Any:
    """The body decoded as `loads_json` decodes it, its regular pieces read by the C scanner (one parse of the
    body, each piece straight into columns cut to `max_entries`: `scan.ScannedPiece`), the others and the
    envelope's own fields by `loads_json` from their spans; None where the scanner declines the body (or is
    not built): decode it the reference way."""
    got = scan.scan_envelope(raw, max_entries, MAX_PIECES, parse_profiling_name)
    if got is None:
        return None
    start, end, pieces = got
    obj = loads_json(raw[:start] + b"[]" + raw[end:])
    if not isinstance(obj, dict):
        return None
    obj["ranks"] = [piece if piece is not None else loads_json(raw[piece_start:piece_end])
                    for piece_start, piece_end, piece in pieces]
    return obj


def from_bytes(raw: bytes, endpoint: str, *, origin: str, max_entries: int = DEFAULT_MAX_ENTRIES,
               pod: str | None = None, namespace: str | None = None, max_ranks: int = MAX_PIECES) -> PodEvidence:
    """Inflate (if gzip), decode, validate and normalize one snapshot body (in a worker process or thread)."""
    if raw[:2] == b"\x1f\x8b":
        raw = gunzip_capped(raw, min(DEFAULT_MAX_SNAPSHOT_BYTES, MAX_EXPANSION * len(raw) + EXPANSION_FLOOR),
                            endpoint)
    try:
        # Too many containers for one body, or some rank's piece is nested too deeply for json: decode the
        # ranks one by one instead (each checked on its own before it is decoded).
        obj = _loads_rank_by_rank(raw, endpoint) if dense(raw) else _scanned_body(raw, max_entries)
        if obj is None:
            obj = loads_json(raw)
    except RecursionError:
        obj = _loads_rank_by_rank(raw, endpoint)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SidecarError(endpoint, f"answer is not JSON: {describe(str(exc))}", retryable=False) from exc
    snapshot = parse_snapshot(obj, endpoint, size_bytes=len(raw))
    del obj
    if len(snapshot.ranks) + len(snapshot.errors) > MAX_PIECES:
        raise SidecarError(endpoint, f"{len(snapshot.ranks)} rank pieces and {len(snapshot.errors)} errors: more "
                           f"than {MAX_PIECES} in one pod's snapshot", retryable=False)
    if pod:
        snapshot.pod = pod
    if namespace:
        snapshot.namespace = namespace
    return from_snapshot(snapshot, origin=origin, max_entries=max_entries, max_ranks=max_ranks)
