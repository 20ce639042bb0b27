"""The sidecar <-> operator wire format (docs/sidecar-api.md), in one place.

Three documents travel between frscope's parts, and this module is the only one that spells them:

- the **snapshot piece**: one rank's recorder with its capture metadata
  (``{"frscope_snapshot": 1, "rank", "captured_at_ns", "source", "stacks", "trace"}``); the sidecar
  serves it, the demo writes it as ``rank-<r>.json``, frscope.records reads it like a torch dump;
- the **snapshot envelope** (``frscope.sidecar.snapshot/v1``): a pod's pieces plus per-rank errors,
  served at ``/v1/snapshot``, pushed to the operator's ``/v1/push`` and kept on disk by the sidecar;
- the **status document** (``frscope.sidecar.status/v1``): per rank and group progress, ``/v1/status``.

Writers (the sidecar, the demo) and readers (the operator, the CLI, frscope.records) import the
names, builders and parsers below, so a field renamed here is renamed for all of them. Pure: no I/O,
no frscope imports, nothing but the standard library (import-linter keeps it so).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

STATUS_SCHEMA = "frscope.sidecar.status/v1"
SNAPSHOT_SCHEMA = "frscope.sidecar.snapshot/v1"
# The key that marks a snapshot piece, and its format number (its value).
SNAPSHOT_KEY = "frscope_snapshot"
SNAPSHOT_FORMAT = 1
SNAPSHOT_PIECE_KEYS = frozenset({SNAPSHOT_KEY, "rank", "captured_at_ns", "source", "stacks", "trace"})
# A piece cut to its newest entries (`/v1/snapshot?entries=N`) says how many older ones it left out.
ENTRIES_DROPPED_KEY = "entries_dropped"
# `/v1/snapshot?entries=N`: the window's bounds (a recorder holds 2,000 entries by default; no ring
# buffer is a million long, and a number past that is a typo or a probe).
SNAPSHOT_WINDOW_MIN = 1
SNAPSHOT_WINDOW_MAX = 1_000_000


# A status document is a few KiB per rank; one past this is refused before it is parsed.
STATUS_MAX_BYTES = 1024 * 1024
# Ints in a status document: seqs, counts and ranks are int64 at most.
_INT64 = (1 << 63) - 1
_MAX_RANK = 1 << 20

# The audience of the tokens the operator mints for one pod's sidecar (TokenRequest); the sidecar
# accepts only its own pod's, so a token shown to one sidecar opens no other.
SIDECAR_AUDIENCE = "frscope.io/sidecar"


def sidecar_audience(namespace: str, pod: str) -> str:
    return f"{SIDECAR_AUDIENCE}/{namespace}/{pod}"


# With TLS between the operator and the sidecars (docs/install.md, "TLS to the sidecars"), the one DNS
# name in a sidecar's certificate: its pod and namespace under a suffix no resolver answers for. The
# operator issues it only to that pod (the pod comes from the pod-bound token the request carries) and
# expects exactly it when it connects to that pod's address, so a certificate opens no other pod.
# A namespace is one DNS label (no dots), so the name reads back unambiguously from the right.
SIDECAR_TLS_SUFFIX = "sidecar.frscope.internal"
# The issuing endpoint on the operator's HTTP port: a CSR (PEM) in, the certificate chain (PEM) out.
CERTIFICATE_PATH = "/v1/certificate"


def sidecar_tls_name(namespace: str, pod: str) -> str:
    return f"{pod}.{namespace}.{SIDECAR_TLS_SUFFIX}".lower()


class WireError(ValueError):
    """A document is not what this module's schema says (the message says which part)."""


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
                         trace_json: bytes) -> bytes:
    """The same piece as JSON bytes, `trace_json` spliced in as is (never decoded again: the sidecar
    keeps recorders as the bytes torch answered)."""
    head = snapshot_piece(rank, captured_at_ns, source, stacks, None)
    del head["trace"]
    return json.dumps(head)[:-1].encode() + b', "trace": ' + trace_json + b"}"


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
    return True


def entries_dropped(piece: dict[str, Any]) -> int:
    """What a windowed piece says it left out (0 when it says nothing or nonsense)."""
    value = piece.get(ENTRIES_DROPPED_KEY)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62:
        return value
    return 0


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
    errors: list[tuple[int | None, str]] = []
    for err in obj.get("errors") or []:
        if isinstance(err, dict):
            errors.append((_int(err.get("rank")), str(err.get("message") or "")[:500]))
    return SidecarSnapshot(
        pod=str(obj.get("pod") or ""), namespace=str(obj.get("namespace") or ""),
        captured_at_ns=_int(obj.get("captured_at_ns")), reason=str(obj.get("reason") or ""),
        ranks=[r for r in ranks if isinstance(r, dict)], errors=errors, size_bytes=size_bytes,
    )


# -- the status document -----------------------------------------------------------------------------


class GroupStatusDoc(TypedDict):
    desc: str
    last_enqueued_seq: int | None
    last_completed_seq: int | None
    inflight_op: str | None
    inflight_seq: int | None
    inflight_age_s: float | None
    stalled: bool
    stalled_since_ns: int | None
    no_progress_s: float
    stall_threshold_s: float
    # Suspected: in flight with no progress past the group's own rhythm; stays true once stalled (the
    # confirmed state), until progress. Absent in documents of sidecars that predate suspicions.
    suspected: NotRequired[bool]
    suspected_since_ns: NotRequired[int | None]
    suspect_threshold_s: NotRequired[float]
    usual_wait_s: NotRequired[float]


class LatenessDoc(TypedDict):
    """A rank against the pod's other ranks (frscope.analysis.lateness), over the last 60 s."""

    group: str
    lateness_s: float
    share: float
    late: int
    compared: int
    window_s: float
    straggler: bool


class RankStatusDoc(TypedDict):
    up: bool
    error: str | None
    last_poll_ns: int | None
    last_ok_ns: int | None
    recorder_ns: int | None
    progress_probe: str | None
    restart_count: int | None  # torchrun's TORCHELASTIC_RESTART_COUNT of the serving process (bootstrap)
    groups: dict[str, GroupStatusDoc]
    lateness: NotRequired[LatenessDoc | None]  # None: not compared (the pod's only rank, or no arrivals yet)


class DumpFileDoc(TypedDict):
    path: str
    rank: int | None
    state: str
    entries: int
    error: str | None


class DumpDirDoc(TypedDict):
    path: str | None
    exists: bool | None
    files: list[DumpFileDoc]


class EvidenceDoc(TypedDict):
    dir: str | None
    captures_in_memory: int
    files_on_disk: int
    latest_capture_ns: int | None
    last_error: str | None


class StatusDoc(TypedDict):
    schema: str
    pod: str
    namespace: str
    node: str
    captured_at_ns: int
    stalled: bool
    suspected: NotRequired[bool]  # some group is suspected (or stalled)
    ranks: dict[str, RankStatusDoc]
    dump_dir: DumpDirDoc
    evidence: EvidenceDoc


@dataclass(frozen=True, slots=True)
class GroupStall:
    rank: int
    group: str
    desc: str
    op: str | None
    seq: int | None
    age_s: float | None
    restarts: int | None = None  # torchrun restarted the rank's worker group this many times


@dataclass(frozen=True, slots=True)
class RankUp:
    """One rank as the sidecar last polled it: `up` (answered), else `error` (why not)."""

    rank: int
    up: bool
    error: str | None = None
    restarts: int | None = None  # torchrun's restart count of the serving process, when the bootstrap knows it


@dataclass(frozen=True, slots=True)
class RankLate:
    """A rank the sidecar reports as a straggler among its pod's ranks (its `lateness` document)."""

    rank: int
    group: str
    lateness_s: float
    share: float  # fraction of the job's time the others spent waiting for it
    late: int
    compared: int


@dataclass(frozen=True, slots=True)
class SidecarStatus:
    pod: str
    namespace: str
    stalled: bool
    stalls: tuple[GroupStall, ...]
    ranks_up: int
    ranks_down: int
    ranks: tuple[RankUp, ...] = ()  # per rank, by rank (the web UI's per-rank status)
    # Groups suspected but not (yet) stalled: a stall not confirmed yet (docs/sidecar.md).
    suspects: tuple[GroupStall, ...] = ()
    stragglers: tuple[RankLate, ...] = ()  # ranks the sidecar reports as stragglers


def loads_status(raw: bytes) -> SidecarStatus:
    """A `/v1/status` answer's bytes -> what the operator needs; WireError for anything else. Bounded:
    at most STATUS_MAX_BYTES, nesting only as deep as the interpreter allows (a RecursionError is a
    WireError), numbers of any size read as "not given". Meant to run off the event loop."""
    if len(raw) > STATUS_MAX_BYTES:
        raise WireError(f"/v1/status: {len(raw)} bytes, more than {STATUS_MAX_BYTES}")
    try:
        obj = json.loads(raw)
    except RecursionError as exc:
        raise WireError("/v1/status: nested too deeply") from exc
    except ValueError as exc:
        raise WireError(f"/v1/status: not JSON ({str(exc)[:120]})") from exc
    return parse_status(obj)


def parse_status(obj: Any) -> SidecarStatus:
    """What the operator needs of a status document (stalled groups, ranks up). WireError if not one;
    nothing else is raised, whatever the values (a 400-digit age is no age)."""
    try:
        return _parse_status(obj)
    except WireError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise WireError(f"/v1/status: unreadable ({type(exc).__name__})") from exc


def _parse_status(obj: Any) -> SidecarStatus:
    if not isinstance(obj, dict) or obj.get("schema") != STATUS_SCHEMA:
        raise WireError(f"/v1/status: not a {STATUS_SCHEMA} object")
    stalls: list[GroupStall] = []
    suspects: list[GroupStall] = []
    stragglers: list[RankLate] = []
    per_rank: list[RankUp] = []
    up = down = 0
    ranks = obj.get("ranks")
    for rank_text, rank_obj in (ranks.items() if isinstance(ranks, dict) else []):
        if not isinstance(rank_obj, dict):
            continue
        if rank_obj.get("up"):
            up += 1
        else:
            down += 1
        digits = isinstance(rank_text, str) and rank_text.isascii() and rank_text.isdigit() and len(rank_text) < 8
        rank = int(rank_text) if digits else _MAX_RANK
        if rank >= _MAX_RANK:
            continue
        error = rank_obj.get("error")
        restarts = _int(rank_obj.get("restart_count"))
        per_rank.append(RankUp(rank, bool(rank_obj.get("up")), _text(error) if error else None, restarts))
        late = rank_obj.get("lateness")
        if isinstance(late, dict) and late.get("straggler") is True:
            stragglers.append(RankLate(rank, _text(late.get("group") or ""), _seconds(late.get("lateness_s")) or 0.0,
                                       _seconds(late.get("share")) or 0.0, _int(late.get("late")) or 0,
                                       _int(late.get("compared")) or 0))
        groups = rank_obj.get("groups")
        for group, g in (groups.items() if isinstance(groups, dict) else []):
            if not isinstance(g, dict) or not (g.get("stalled") or g.get("suspected")):
                continue
            found = GroupStall(rank, _text(group), _text(g.get("desc") or ""),
                               _text(g["inflight_op"]) if g.get("inflight_op") else None,
                               _int(g.get("inflight_seq")), _seconds(g.get("inflight_age_s")), restarts)
            (stalls if g.get("stalled") else suspects).append(found)
    return SidecarStatus(
        pod=_text(obj.get("pod") or ""), namespace=_text(obj.get("namespace") or ""),
        stalled=bool(obj.get("stalled")) or bool(stalls), stalls=tuple(stalls), ranks_up=up, ranks_down=down,
        ranks=tuple(sorted(per_rank, key=lambda r: r.rank)), suspects=tuple(suspects),
        stragglers=tuple(stragglers),
    )


def _int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value <= _INT64
    return value if ok else None


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > 1 << 53:
        return None
    got = float(value)
    return got if math.isfinite(got) else None


def _text(value: Any, limit: int = 200) -> str:
    """A string of the document (capped), never str() of a container (its repr may be enormous)."""
    if isinstance(value, str):
        return value[:limit]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and _int(value) is not None:
        return str(value)
    return "?" if value is not None else ""
