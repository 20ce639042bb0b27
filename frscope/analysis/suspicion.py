"""Node suspicion across incidents of different jobs: the model of the node ledger (docs/actions.md,
"The node ledger"). Pure functions over plain data: no I/O, no Kubernetes objects.

One incident (a published diagnosis) implicates the nodes its culprit ranks ran on. Each node gets an
evidence class and a weight:

    code              0    the job's own fault: a rank that never joined (stuck in the user's Python),
                           a type/size/dtype/p2p mismatch, a crash with an ordinary error exit, an Xid
                           that applications cause (13, 31, 43), a container over its own memory limit
    unclear           0    says nothing about a node: an ambiguous verdict, missing dumps, a crash by
                           a signal with no sign of hardware, a rank whose end is unknown
    stuck-collective  1    every rank entered a collective and it never completed (NotCompleted)
    straggler         0.5  a rank repeatedly late; it weighs on the node when it follows the node
                           across jobs (suspicion needs two jobs)
    hardware-exit     1    a rank's end names the hardware: an Xid, an uncorrectable ECC error, a GPU
                           fallen off the bus, an NVLink error
    node-oom          0.5  the node ran out of memory (the kubelet evicted for memory, a system OOM)

A stuck collective or a straggler that names ranks on several nodes splits its weight between them;
a rank's own end weighs on its own node only. A node's score is the sum of its incidents' weights,
each halved every `half_life_s`. The node is *suspected* when its score reaches `suspect_score` with
evidence from at least `suspect_jobs` different jobs; it is *ready to fence* when it is suspected and
at least `fence_incidents` weighing incidents of at least `fence_jobs` different jobs fall within
`fence_window_s` — counting only incidents after a person last released it (an uncordon).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


class EvidenceClass(StrEnum):
    CODE = "code"
    UNCLEAR = "unclear"
    STUCK_COLLECTIVE = "stuck-collective"
    STRAGGLER = "straggler"
    HARDWARE_EXIT = "hardware-exit"
    NODE_OOM = "node-oom"


WEIGHTS: dict[EvidenceClass, float] = {
    EvidenceClass.CODE: 0.0,
    EvidenceClass.UNCLEAR: 0.0,
    EvidenceClass.STUCK_COLLECTIVE: 1.0,
    EvidenceClass.STRAGGLER: 0.5,
    EvidenceClass.HARDWARE_EXIT: 1.0,
    EvidenceClass.NODE_OOM: 0.5,
}

# Verdicts decided by what the ranks' code called: never the node's fault.
CODE_CATEGORIES = frozenset({"RankNotJoined", "CollectiveTypeMismatch", "SizeMismatch", "DtypeMismatch",
                             "P2PMismatch"})
# Verdicts where every rank called the collective right and the device or the fabric did not finish it.
STUCK_CATEGORIES = frozenset({"NotCompleted"})
STRAGGLER_CATEGORIES = frozenset({"Straggler"})

# NVIDIA Xid errors that applications cause (graphics engine exception, GPU memory page fault, GPU
# stopped processing); 45 is the driver's cleanup after another error and says nothing on its own.
APPLICATION_XIDS = frozenset({13, 31, 43})
FOLLOW_UP_XIDS = frozenset({45})
_XID = re.compile(r"\bXid\b(?:\s*\([^)]{0,64}\))?\s*[:=]?\s*(\d{1,4})?", re.IGNORECASE)
_HARDWARE = re.compile(
    r"uncorrectable ECC|double[- ]bit ECC|ECC error|fallen off the bus|GPU is lost|GPU lost"
    r"|NVLink (?:error|failure|fatal)|row[- ]remap\w* failure|cudaErrorECCUncorrectable"
    r"|unrecoverable hardware error|machine check",
    re.IGNORECASE,
)
_NODE_OOM = re.compile(r"node was low on resource: memory|system OOM|node OOM|NodeOOM", re.IGNORECASE)
# What one node's ledger object may hold (its CRD's maxItems).
MAX_INCIDENTS = 256
# A rank's text (its termination message, a log tail) is hostile: only this much of it is searched.
MESSAGE_SCAN_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class RankEnd:
    """How one culprit rank's process ended, as the report recorded it (records.RankExit's fields),
    plus its pod's own status reason and message (a kubelet eviction says so there)."""

    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    pod_reason: str = ""
    pod_message: str = ""


@dataclass(frozen=True, slots=True)
class IncidentInput:
    """One published diagnosis, as the ledger reads it."""

    key: str  # the incident's identity (its report, namespace/name): recorded once per node
    job: str  # namespace/name
    job_uid: str
    at: float  # when it was gathered, epoch seconds
    category: str  # the top finding's category ('Healthy' when none)
    ambiguous: bool
    nodes: Mapping[str, tuple[int, ...]]  # node -> the culprit ranks that ran there
    exits: Mapping[int, RankEnd]  # culprit rank -> how it ended, where known


@dataclass(frozen=True, slots=True)
class NodeIncident:
    """One incident as recorded against one node: what the ledger object keeps."""

    key: str
    job: str
    job_uid: str
    at: float
    category: str
    evidence: EvidenceClass
    weight: float
    why: str
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LedgerPolicy:
    half_life_s: float = 86_400.0  # an incident's weight halves every day
    suspect_score: float = 1.5
    suspect_jobs: int = 2
    fence_incidents: int = 2
    fence_jobs: int = 2
    fence_window_s: float = 86_400.0
    memory_s: float = 7 * 86_400.0  # older incidents are forgotten (weight below 1/128 of its own)
    max_incidents: int = 64  # per node, newest kept

    def __post_init__(self) -> None:
        if not (self.half_life_s > 0 and self.fence_window_s > 0 and self.memory_s > 0):
            raise ValueError("the ledger's half-life, fence window and memory must be > 0 seconds")
        if not (math.isfinite(self.suspect_score) and self.suspect_score > 0):
            raise ValueError("the ledger's suspect score must be a number > 0")
        if min(self.suspect_jobs, self.fence_incidents, self.fence_jobs, self.max_incidents) < 1:
            raise ValueError("the ledger's job and incident counts must be >= 1")
        if self.max_incidents > MAX_INCIDENTS:
            raise ValueError(f"the ledger keeps at most {MAX_INCIDENTS} incidents per node")


class NodeState(StrEnum):
    WATCHED = "watched"
    SUSPECTED = "suspected"
    FENCED = "fenced"


@dataclass(frozen=True, slots=True)
class Assessment:
    score: float
    incidents: int  # incidents that weigh on the node (weight > 0), remembered
    jobs: int  # distinct jobs among them
    last_incident: float | None  # the newest incident of any class
    state: NodeState
    fence_ready: bool
    why: str  # one line: why this state (and why not fenced)


def _scan(text: str) -> str:
    return text[:MESSAGE_SCAN_LIMIT] if isinstance(text, str) else ""


def exit_evidence(end: RankEnd) -> tuple[EvidenceClass, str] | None:
    """What a culprit's end says about its node; None when it ended in no known way."""
    texts = [_scan(end.message), _scan(end.pod_message)]
    xids = [int(m.group(1)) if m.group(1) else None for t in texts for m in _XID.finditer(t)]
    telling = [x for x in xids if x not in FOLLOW_UP_XIDS]
    hardware_xid = [x for x in telling if x is None or x not in APPLICATION_XIDS]
    if hardware_xid:
        number = hardware_xid[0]
        return EvidenceClass.HARDWARE_EXIT, f"Xid {number} in its end" if number is not None else "an Xid in its end"
    for text in texts:
        found = _HARDWARE.search(text)
        if found:
            return EvidenceClass.HARDWARE_EXIT, f"'{found.group(0)}' in its end"
    if end.pod_reason == "Evicted" and "memory" in _scan(end.pod_message).lower():
        return EvidenceClass.NODE_OOM, "evicted: the node was low on memory"
    for text in texts:
        found = _NODE_OOM.search(text)
        if found:
            return EvidenceClass.NODE_OOM, f"'{found.group(0)}' in its end"
    if telling:
        return EvidenceClass.CODE, f"Xid {telling[0]}, which applications cause"
    if end.reason == "OOMKilled":
        return EvidenceClass.CODE, "OOMKilled: over its container's own memory limit"
    if end.exit_code is not None and 0 < end.exit_code < 128:
        return EvidenceClass.CODE, f"exited with code {end.exit_code}, an error of its own, no sign of hardware"
    if end.exit_code is not None and end.exit_code != 0:
        return EvidenceClass.UNCLEAR, f"ended by a signal (exit code {end.exit_code}), no sign of hardware"
    return None


def _rank_evidence(ranks: tuple[int, ...], exits: Mapping[int, RankEnd]) -> tuple[EvidenceClass, str] | None:
    """The strongest thing the ends of a node's culprit ranks say: hardware, then node OOM, then the rest."""
    order = [EvidenceClass.HARDWARE_EXIT, EvidenceClass.NODE_OOM, EvidenceClass.CODE, EvidenceClass.UNCLEAR]
    found: list[tuple[int, EvidenceClass, str]] = []
    for rank in ranks:
        end = exits.get(rank)
        said = exit_evidence(end) if end is not None else None
        if said is not None:
            found.append((rank, *said))
    if not found:
        return None
    rank, cls, why = min(found, key=lambda f: (order.index(f[1]), f[0]))
    return cls, f"rank {rank}: {why}"


def implicate(incident: IncidentInput) -> dict[str, NodeIncident]:
    """The nodes an incident implicates, each with its evidence class and weight (in node order)."""
    nodes = {n: tuple(sorted(set(r))) for n, r in incident.nodes.items() if n}
    out: dict[str, NodeIncident] = {}
    for node, ranks in sorted(nodes.items()):
        cls, why = _classify(incident, ranks, len(nodes))
        weight = WEIGHTS[cls]
        if cls in (EvidenceClass.STUCK_COLLECTIVE, EvidenceClass.STRAGGLER) and len(nodes) > 1:
            weight /= len(nodes)
            why += f" (its weight split over {len(nodes)} nodes)"
        out[node] = NodeIncident(key=incident.key, job=incident.job, job_uid=incident.job_uid, at=incident.at,
                                 category=incident.category, evidence=cls, weight=round(weight, 4), why=why,
                                 ranks=ranks)
    return out


def _classify(incident: IncidentInput, ranks: tuple[int, ...], spread: int) -> tuple[EvidenceClass, str]:
    category = incident.category
    if category in CODE_CATEGORIES:
        return EvidenceClass.CODE, f"{category}: what the ranks' code called, not the node"
    # A rank's own end is the most direct evidence about its node, whatever else the verdict says.
    said = _rank_evidence(ranks, incident.exits)
    if said is not None and said[0] in (EvidenceClass.HARDWARE_EXIT, EvidenceClass.NODE_OOM):
        return said[0], f"{category}: {said[1]}"
    if incident.ambiguous:
        return EvidenceClass.UNCLEAR, f"{category}: the verdict is ambiguous (candidates, not culprits)"
    if category in STUCK_CATEGORIES:
        return EvidenceClass.STUCK_COLLECTIVE, f"{category}: every rank entered the collective, it never completed"
    if category in STRAGGLER_CATEGORIES:
        return EvidenceClass.STRAGGLER, f"{category}: a rank here was repeatedly late"
    if said is not None:
        return said[0], f"{category}: {said[1]}"
    return EvidenceClass.UNCLEAR, f"{category}: says nothing about the node"


def decayed(weight: float, at: float, now: float, half_life_s: float) -> float:
    """`weight` halved for every `half_life_s` since `at` (an incident from the future counts in full)."""
    age = max(now - at, 0.0)
    return weight * math.pow(0.5, age / half_life_s)


def remember(known: Iterable[NodeIncident], new: Iterable[NodeIncident], now: float,
             policy: LedgerPolicy) -> list[NodeIncident]:
    """A node's incidents with `new` added (an incident already known by its key is kept as it was),
    those older than `memory_s` forgotten, at most `max_incidents`, the newest; oldest first."""
    by_key: dict[str, NodeIncident] = {}
    for item in [*known, *new]:
        by_key.setdefault(item.key, item)
    kept = [i for i in by_key.values() if now - i.at <= policy.memory_s]
    kept.sort(key=lambda i: (i.at, i.key))
    return kept[-policy.max_incidents:]


def score(incidents: Iterable[NodeIncident], now: float, policy: LedgerPolicy) -> float:
    return round(sum(decayed(i.weight, i.at, now, policy.half_life_s) for i in incidents if i.weight > 0), 3)


def assess(incidents: Iterable[NodeIncident], now: float, policy: LedgerPolicy, *, fenced: bool = False,
           released_at: float | None = None) -> Assessment:
    """The node's score and state. `fenced`: frscope holds it cordoned now; `released_at`: when a person
    last lifted frscope's fence (incidents before it never fence the node again)."""
    items = [i for i in incidents if now - i.at <= policy.memory_s]
    weighing = [i for i in items if i.weight > 0]
    total = score(weighing, now, policy)
    jobs = {i.job_uid or i.job for i in weighing}
    last = max((i.at for i in items), default=None)
    suspected = total >= policy.suspect_score and len(jobs) >= policy.suspect_jobs
    fresh = [i for i in weighing if now - i.at <= policy.fence_window_s
             and (released_at is None or i.at > released_at)]
    fresh_jobs = {i.job_uid or i.job for i in fresh}
    ready = (suspected and not fenced and len(fresh) >= policy.fence_incidents
             and len(fresh_jobs) >= policy.fence_jobs)
    if fenced:
        state, why = NodeState.FENCED, "cordoned by frscope; lifting it is a person's decision"
    elif suspected:
        state = NodeState.SUSPECTED
        why = (f"score {total:.2f} >= {policy.suspect_score:g} with evidence from {len(jobs)} jobs")
        if not ready:
            window_h = policy.fence_window_s / 3600
            after = " since a person released it" if released_at is not None else ""
            why += (f"; not ready to fence: {len(fresh)} weighing incident(s) of {len(fresh_jobs)} job(s) in the "
                    f"last {window_h:g} h{after} ({policy.fence_incidents} of {policy.fence_jobs} needed)")
    else:
        state = NodeState.WATCHED
        why = (f"score {total:.2f} (suspected from {policy.suspect_score:g}), evidence from {len(jobs)} job(s) "
               f"({policy.suspect_jobs} needed)")
    return Assessment(score=total, incidents=len(weighing), jobs=len(jobs), last_incident=last, state=state,
                      fence_ready=ready, why=why)
