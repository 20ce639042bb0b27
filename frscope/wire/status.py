"""The status document (`/v1/status`, frscope.sidecar.status/v1): its shape as the sidecar writes it
(`TypedDict`s), and what the operator reads of it (`loads_status`, bounded; `SidecarStatus`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from frscope.wire.common import MAX_RANK, STATUS_MAX_BYTES, STATUS_SCHEMA, WireError, read_int, read_seconds, read_text

# Per rank and group, the status document carries its newest STATUS_ARRIVALS arrivals, each
# [collective_seq_id, enqueue time in ns] or, where the recorder dates the collective's wait (NCCL with
# timing), [collective_seq_id, enqueue ns, wait ns], for the operator's lateness across pods
# (frscope.analysis.pod_lateness); a reader keeps at most that many of each list. A document carries at
# most STATUS_ARRIVALS_TOTAL arrivals in all (at most about 400 KiB, well inside STATUS_MAX_BYTES): with many
# ranks and groups, fewer each.
STATUS_ARRIVALS = 256
STATUS_ARRIVALS_TOTAL = 6144
# What the operator reads of one document, whatever it holds (a hostile sidecar's is well inside
# STATUS_MAX_BYTES with 100,000s of arrivals in 1,000s of groups): at most STATUS_ARRIVALS_TOTAL
# arrivals in all, STATUS_MAX_GROUPS groups a rank and STATUS_MAX_RANKS ranks (a pod hosts a node's
# ranks: 8-64).
STATUS_MAX_GROUPS = 64
STATUS_MAX_RANKS = 1024


def status_arrivals_each(lists: int) -> int:
    """How many arrivals each of a status document's `lists` (rank, group) lists carries."""
    return min(STATUS_ARRIVALS, STATUS_ARRIVALS_TOTAL // max(1, lists))

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
    # The newest STATUS_ARRIVALS [collective_seq_id, enqueue ns(, wait ns)] of the rank in the group
    # (absent in documents of sidecars that predate lateness across pods).
    arrivals: NotRequired[list[list[int]]]


class LatenessDoc(TypedDict):
    """A rank against the pod's other ranks (frscope.analysis.lateness), over the last 60 s."""

    group: str
    lateness_s: float
    share: float
    late: int
    compared: int
    window_s: float
    straggler: bool


class UnrecordedWaitDoc(TypedDict):
    """A rank waiting in a torch.distributed call its recorder does not show (gloo's p2p,
    monitored_barrier) while every recorder of the pod is idle: a hang the recorder cannot see."""

    op: str  # the call its stack waits in: recv, monitored_barrier, batch_isend_irecv (pipelining)...
    site: str  # where the user's code called it ("" if unknown)
    no_progress_s: float  # how long the pod's recorders have been idle
    suspected_since_ns: int | None
    stalled: bool
    stalled_since_ns: int | None
    usual_step_s: float
    suspect_threshold_s: float


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
    # None: the rank is in no hang the recorder cannot see (absent in documents of older sidecars)
    unrecorded_wait: NotRequired[UnrecordedWaitDoc | None]


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
    # The sidecar's wall clock when it answered (its pod's ranks share it: one node): the operator
    # measures each pod's clock offset from it and its own times around the request.
    answered_at_ns: NotRequired[int]
    stalled: bool
    suspected: NotRequired[bool]  # some group is suspected (or stalled)
    ranks: dict[str, RankStatusDoc]
    dump_dir: DumpDirDoc
    evidence: EvidenceDoc


@dataclass(frozen=True, slots=True)
class GroupStall:
    rank: int
    group: str  # "" for a wait the recorder does not show (`unrecorded`)
    desc: str
    op: str | None
    seq: int | None
    age_s: float | None
    restarts: int | None = None  # torchrun restarted the rank's worker group this many times
    unrecorded: bool = False  # a wait in a call the recorder does not show: the rank's stack's (no group, no seq)

    def where(self) -> str:
        """'all_reduce #12 of group 0', or 'recv (not recorded: seen in its stack)'."""
        if self.unrecorded:
            return f"{self.op} (not recorded: seen in its stack)"
        return f"{self.op} #{self.seq} of group {self.group}"


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
    # rank -> group -> its newest (collective_seq_id, enqueue ns[, wait ns]), at most STATUS_ARRIVALS each
    arrivals: dict[int, dict[str, tuple[tuple[int, ...], ...]]] = field(default_factory=dict)
    answered_at_ns: int | None = None  # the sidecar's clock when it answered
    # Set by the reader, not read from the document: its own wall clock just before it asked and just
    # after the answer arrived (with answered_at_ns, the pod's clock offset within half the round trip).
    asked_ns: int | None = None
    received_ns: int | None = None


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
    arrivals: dict[int, dict[str, tuple[tuple[int, ...], ...]]] = {}
    up = down = 0
    budget = STATUS_ARRIVALS_TOTAL  # arrivals left to read in this document
    ranks = obj.get("ranks")
    for index, (rank_text, rank_obj) in enumerate(ranks.items() if isinstance(ranks, dict) else []):
        if index >= STATUS_MAX_RANKS:
            break
        if not isinstance(rank_obj, dict):
            continue
        if rank_obj.get("up"):
            up += 1
        else:
            down += 1
        digits = isinstance(rank_text, str) and rank_text.isascii() and rank_text.isdigit() and len(rank_text) < 8
        rank = int(rank_text) if digits else MAX_RANK
        if rank >= MAX_RANK:
            continue
        error = rank_obj.get("error")
        restarts = read_int(rank_obj.get("restart_count"))
        per_rank.append(RankUp(rank, bool(rank_obj.get("up")), read_text(error) if error else None, restarts))
        late = rank_obj.get("lateness")
        if isinstance(late, dict) and late.get("straggler") is True:
            stragglers.append(RankLate(rank, read_text(late.get("group") or ""),
                                       read_seconds(late.get("lateness_s")) or 0.0,
                                       read_seconds(late.get("share")) or 0.0, read_int(late.get("late")) or 0,
                                       read_int(late.get("compared")) or 0))
        unrecorded = rank_obj.get("unrecorded_wait")
        if isinstance(unrecorded, dict) and isinstance(unrecorded.get("op"), str):
            found_wait = GroupStall(rank, "", "", read_text(unrecorded["op"]), None,
                                    read_seconds(unrecorded.get("no_progress_s")), restarts, unrecorded=True)
            (stalls if unrecorded.get("stalled") is True else suspects).append(found_wait)
        groups = rank_obj.get("groups")
        for number, (group, g) in enumerate(groups.items() if isinstance(groups, dict) else []):
            if number >= STATUS_MAX_GROUPS:
                break
            if not isinstance(g, dict):
                continue
            pairs = _arrivals(g.get("arrivals"), budget) if budget > 0 else ()
            if pairs:
                budget -= len(pairs)
                arrivals.setdefault(rank, {})[read_text(group)] = pairs
            if not (g.get("stalled") or g.get("suspected")):
                continue
            found = GroupStall(rank, read_text(group), read_text(g.get("desc") or ""),
                               read_text(g["inflight_op"]) if g.get("inflight_op") else None,
                               read_int(g.get("inflight_seq")), read_seconds(g.get("inflight_age_s")), restarts)
            (stalls if g.get("stalled") else suspects).append(found)
    return SidecarStatus(
        pod=read_text(obj.get("pod") or ""), namespace=read_text(obj.get("namespace") or ""),
        stalled=bool(obj.get("stalled")) or bool(stalls), stalls=tuple(stalls), ranks_up=up, ranks_down=down,
        ranks=tuple(sorted(per_rank, key=lambda r: r.rank)), suspects=tuple(suspects),
        stragglers=tuple(stragglers), arrivals=arrivals, answered_at_ns=read_int(obj.get("answered_at_ns")),
    )


def _arrivals(value: Any, most: int = STATUS_ARRIVALS) -> tuple[tuple[int, ...], ...]:
    """A group's `arrivals`: its newest min(STATUS_ARRIVALS, `most`) well-formed [seq, ns] or
    [seq, ns, wait ns] (others skipped; a negative wait is no wait)."""
    if not isinstance(value, list):
        return ()
    out: list[tuple[int, ...]] = []
    for item in value[-min(STATUS_ARRIVALS, most):]:
        if not isinstance(item, list) or len(item) not in (2, 3):
            continue
        seq, ns = read_int(item[0]), read_int(item[1])
        if seq is None or ns is None or ns <= 0:
            continue
        wait = read_int(item[2]) if len(item) == 3 else None
        out.append((seq, ns, wait) if wait is not None and wait >= 0 else (seq, ns))
    return tuple(out)
