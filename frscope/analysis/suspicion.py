"""Node suspicion across incidents of different tenants: the model of the node ledger (docs/actions.md,
"The node ledger"; docs/install.md, "Threat model"). Pure functions over plain data: no I/O, no
Kubernetes objects.

One incident (a published diagnosis) implicates the nodes its culprit ranks ran on. Each node gets an
evidence class and a weight:

    code              0    the job's own fault: a rank that never joined (stuck in the user's Python),
                           a type/size/dtype/p2p mismatch, a crash with an ordinary error exit, a
                           container over its own memory limit
    unclear           0    says nothing about a node: an ambiguous verdict, missing dumps, a crash by
                           a signal, a rank whose end is unknown
    stuck-collective  1    every rank entered a collective and it never completed (NotCompleted)
    straggler         0.5  a rank repeatedly late
    hardware-exit     1    the NODE reports a hardware problem: a condition that node-problem-detector or
                           a GPU health agent (NVSentinel, DCGM) set True on the Node object
    node-oom          0.5  the NODE ran out of memory: the kubelet's SystemOOM Event on the Node, or its
                           MemoryPressure condition

Hardware and node OOM evidence comes only from node-sourced signals (`NodeSignal`, read from the Node
object and the kubelet's Events by the operator), never from text a container wrote: a termination
message saying "Xid 79 ... fallen off the bus" is the tenant's word and says nothing about the node.

A stuck collective or a straggler that names ranks on several nodes splits its weight between them.
A node's score is the sum of its incidents' weights, each halved every `half_life_s`. Incidents are
counted by tenant (the report's namespace), not by job: one namespace's jobs, however many, are one
voice. The node is *suspected* when its score reaches `suspect_score` with weighing evidence from at
least `suspect_namespaces` namespaces and (`need_node_evidence`, the default) at least one incident
backed by a node-sourced signal; it is *ready to fence* when it is suspected and at least
`fence_incidents` weighing incidents of at least `fence_namespaces` namespaces, one of them node-sourced,
fall within `fence_window_s`, counting only incidents after a person last released it (an uncordon).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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

# What one node's ledger object may hold (its CRD's maxItems).
MAX_INCIDENTS = 256
# Evidence classes only a node-sourced signal gives (NodeSignal): never read from a report's text.
NODE_SOURCED = frozenset({EvidenceClass.HARDWARE_EXIT, EvidenceClass.NODE_OOM})


@dataclass(frozen=True, slots=True)
class RankEnd:
    """How one culprit rank's process ended, as the report recorded it (records.RankExit's fields).
    Its reason and message are what the container wrote: kept for the record, never read as evidence
    about the node."""

    exit_code: int | None = None
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class NodeSignal:
    """What the node itself said when the incident was recorded: a hardware condition set True by
    node-problem-detector or a GPU health agent, or the kubelet's report of a node out of memory.
    `evidence` is one of NODE_SOURCED."""

    evidence: EvidenceClass
    why: str

    def __post_init__(self) -> None:
        if self.evidence not in NODE_SOURCED:
            raise ValueError(f"a node signal is hardware or node OOM evidence, not {self.evidence.value}")


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
    # node -> what the node itself reported (read by the operator from the Node and the kubelet's Events)
    node_signals: Mapping[str, NodeSignal] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return namespace_of(self.key)


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

    @property
    def namespace(self) -> str:
        """The tenant: the namespace of the incident's report (the API server's, not the report's words)."""
        return namespace_of(self.key)


def namespace_of(key: str) -> str:
    return key.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class LedgerPolicy:
    half_life_s: float = 86_400.0  # an incident's weight halves every day
    suspect_score: float = 1.5
    suspect_namespaces: int = 2  # tenants, not jobs: one namespace's jobs are one voice
    fence_incidents: int = 2
    fence_namespaces: int = 2
    need_node_evidence: bool = True  # at least one incident backed by a NodeSignal
    fence_window_s: float = 86_400.0
    memory_s: float = 7 * 86_400.0  # older incidents are forgotten (weight below 1/128 of its own)
    max_incidents: int = 64  # per node, newest kept

    def __post_init__(self) -> None:
        if not (self.half_life_s > 0 and self.fence_window_s > 0 and self.memory_s > 0):
            raise ValueError("the ledger's half-life, fence window and memory must be > 0 seconds")
        if not (math.isfinite(self.suspect_score) and self.suspect_score > 0):
            raise ValueError("the ledger's suspect score must be a number > 0")
        if min(self.suspect_namespaces, self.fence_incidents, self.fence_namespaces, self.max_incidents) < 1:
            raise ValueError("the ledger's namespace and incident counts must be >= 1")
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
    namespaces: int  # distinct namespaces (tenants) among them: what suspicion counts
    node_sourced: int  # weighing incidents backed by a node-sourced signal
    last_incident: float | None  # the newest incident of any class
    state: NodeState
    fence_ready: bool
    why: str  # one line: why this state (and why not fenced)


def exit_evidence(end: RankEnd) -> tuple[EvidenceClass, str] | None:
    """What a culprit's end says about its node: never hardware (its text is the container's own, and
    its exit code the process's choice); None when it ended in no known way."""
    if end.reason == "OOMKilled":
        return EvidenceClass.CODE, "OOMKilled: over its container's own memory limit"
    if end.exit_code is not None and 0 < end.exit_code < 128:
        return EvidenceClass.CODE, f"exited with code {end.exit_code}, an error of its own"
    if end.exit_code is not None and end.exit_code != 0:
        return EvidenceClass.UNCLEAR, f"ended by a signal (exit code {end.exit_code})"
    return None


def _rank_evidence(ranks: tuple[int, ...], exits: Mapping[int, RankEnd]) -> tuple[EvidenceClass, str] | None:
    """The strongest thing the ends of a node's culprit ranks say (a code fault, then unclear)."""
    order = [EvidenceClass.CODE, EvidenceClass.UNCLEAR]
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
        cls, why = _classify(incident, node, ranks)
        weight = WEIGHTS[cls]
        if cls in (EvidenceClass.STUCK_COLLECTIVE, EvidenceClass.STRAGGLER) and len(nodes) > 1:
            weight /= len(nodes)
            why += f" (its weight split over {len(nodes)} nodes)"
        out[node] = NodeIncident(key=incident.key, job=incident.job, job_uid=incident.job_uid, at=incident.at,
                                 category=incident.category, evidence=cls, weight=round(weight, 4), why=why,
                                 ranks=ranks)
    return out


def _classify(incident: IncidentInput, node: str, ranks: tuple[int, ...]) -> tuple[EvidenceClass, str]:
    category = incident.category
    if category in CODE_CATEGORIES:
        return EvidenceClass.CODE, f"{category}: what the ranks' code called, not the node"
    if incident.ambiguous:
        return EvidenceClass.UNCLEAR, f"{category}: the verdict is ambiguous (candidates, not culprits)"
    # What the node itself reported is the most direct evidence about it, whatever else the verdict says.
    signal = incident.node_signals.get(node)
    if signal is not None:
        return signal.evidence, f"{category}: {signal.why}"
    if category in STUCK_CATEGORIES:
        return EvidenceClass.STUCK_COLLECTIVE, f"{category}: every rank entered the collective, it never completed"
    if category in STRAGGLER_CATEGORIES:
        return EvidenceClass.STRAGGLER, f"{category}: a rank here was repeatedly late"
    said = _rank_evidence(ranks, incident.exits)
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
    tenants = {i.namespace for i in weighing}
    sourced = [i for i in weighing if i.evidence in NODE_SOURCED]
    last = max((i.at for i in items), default=None)
    node_said = bool(sourced) or not policy.need_node_evidence
    suspected = total >= policy.suspect_score and len(tenants) >= policy.suspect_namespaces and node_said
    fresh = [i for i in weighing if now - i.at <= policy.fence_window_s
             and (released_at is None or i.at > released_at)]
    fresh_tenants = {i.namespace for i in fresh}
    fresh_said = any(i.evidence in NODE_SOURCED for i in fresh) or not policy.need_node_evidence
    ready = (suspected and not fenced and len(fresh) >= policy.fence_incidents
             and len(fresh_tenants) >= policy.fence_namespaces and fresh_said)
    if fenced:
        state, why = NodeState.FENCED, "cordoned by frscope; lifting it is a person's decision"
    elif suspected:
        state = NodeState.SUSPECTED
        why = (f"score {total:.2f} >= {policy.suspect_score:g} with evidence from {len(tenants)} namespaces, "
               f"{len(sourced)} incident(s) backed by the node's own signals")
        if not ready:
            window_h = policy.fence_window_s / 3600
            after = " since a person released it" if released_at is not None else ""
            why += (f"; not ready to fence: {len(fresh)} weighing incident(s) of {len(fresh_tenants)} namespace(s) "
                    f"in the last {window_h:g} h{after} ({policy.fence_incidents} of {policy.fence_namespaces} "
                    "needed, one backed by the node)")
    else:
        state = NodeState.WATCHED
        why = (f"score {total:.2f} (suspected from {policy.suspect_score:g}), evidence from {len(tenants)} "
               f"namespace(s) ({policy.suspect_namespaces} needed)")
        if policy.need_node_evidence:
            why += f", {len(sourced)} backed by the node's own signals (1 needed)"
    return Assessment(score=total, incidents=len(weighing), jobs=len(jobs), namespaces=len(tenants),
                      node_sourced=len(sourced), last_incident=last, state=state, fence_ready=ready, why=why)
