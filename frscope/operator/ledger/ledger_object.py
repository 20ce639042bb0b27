"""The FlightRecorderNode object (charts/frscope/crds/flightrecordernode.yaml): one per implicated
node, cluster-scoped, named after the node. Building it from the ledger's model and reading it back
(defensively: whatever is malformed is dropped, never trusted). Pure.

    node       name, pool
    summary    score (at scoreAt), incidents, distinct jobs and namespaces that weigh, incidents backed by
               the node's own signals, last incident, state, why
    incidents  each incident with its evidence class and weight, oldest first
    fence      frscope's last fencing step: would-fence (dry run), fencing (the claim), fenced,
               skipped, failed, released (a person made the node schedulable again: releasedAt, releasedBy)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from frscope.analysis.suspicion import Assessment, EvidenceClass, NodeIncident
from frscope.operator import names
from frscope.operator.ledger.incident_input import parse_time

MAX_TEXT = 512

WOULD_FENCE = "would-fence"
FENCING = "fencing"
FENCED = "fenced"
SKIPPED = "skipped"
FAILED = "failed"
RELEASED = "released"
FENCE_STATES = (WOULD_FENCE, FENCING, FENCED, SKIPPED, FAILED, RELEASED)
# Steps after which frscope holds the node fenced (a claim counts: the cordon may be under way).
HOLDING = (FENCING, FENCED)


def rfc3339(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _clip(text: Any, limit: int = MAX_TEXT) -> str:
    line = " ".join(str(text).split()) if isinstance(text, str) else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class FenceRecord:
    state: str
    at: str
    mode: str = ""
    cordoned: bool = False
    tainted: bool = False
    incident: str = ""  # the report whose incident made the node ready to fence (namespace/name)
    message: str = ""
    released_at: str = ""
    released_by: str = ""

    @property
    def holding(self) -> bool:
        return self.state in HOLDING

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "at": self.at, "mode": self.mode, "cordoned": self.cordoned,
                               "tainted": self.tainted, "incident": _clip(self.incident),
                               "message": _clip(self.message, 1024)}
        if self.released_at:
            out["releasedAt"] = self.released_at
            out["releasedBy"] = _clip(self.released_by, 256)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> FenceRecord | None:
        if not isinstance(obj, dict) or obj.get("state") not in FENCE_STATES or parse_time(obj.get("at")) is None:
            return None
        released = obj.get("releasedAt")
        return cls(state=str(obj["state"]), at=str(obj["at"]), mode=_clip(obj.get("mode"), 32),
                   cordoned=obj.get("cordoned") is True, tainted=obj.get("tainted") is True,
                   incident=_clip(obj.get("incident")), message=_clip(obj.get("message"), 1024),
                   released_at=str(released) if parse_time(released) is not None else "",
                   released_by=_clip(obj.get("releasedBy"), 256))

    def released(self, at: str, by: str) -> FenceRecord:
        return replace(self, state=RELEASED, released_at=at, released_by=by)


def incident_to_json(item: NodeIncident) -> dict[str, Any]:
    return {"key": _clip(item.key), "job": _clip(item.job), "jobUid": _clip(item.job_uid, 64), "at": rfc3339(item.at),
            "category": _clip(item.category, 64), "evidence": item.evidence.value, "weight": item.weight,
            "why": _clip(item.why), "ranks": list(item.ranks[:64])}


def incident_from_json(obj: Any) -> NodeIncident | None:
    if not isinstance(obj, dict):
        return None
    at = parse_time(obj.get("at"))
    weight = obj.get("weight")
    key = obj.get("key")
    try:
        evidence = EvidenceClass(str(obj.get("evidence")))
    except ValueError:
        return None
    if at is None or not isinstance(key, str) or not key or isinstance(weight, bool) \
            or not isinstance(weight, (int, float)) or not 0 <= weight <= 1:
        return None
    ranks = obj.get("ranks")
    return NodeIncident(key=key, job=_clip(obj.get("job")), job_uid=_clip(obj.get("jobUid"), 64), at=at,
                        category=_clip(obj.get("category"), 64), evidence=evidence, weight=float(weight),
                        why=_clip(obj.get("why")),
                        ranks=tuple(r for r in ranks[:64] if isinstance(r, int) and not isinstance(r, bool))
                        if isinstance(ranks, list) else ())


@dataclass(slots=True)
class LedgerEntry:
    """One FlightRecorderNode as read (or about to be created)."""

    node: str
    pool: str = ""
    incidents: list[NodeIncident] = field(default_factory=list)
    fence: FenceRecord | None = None
    state: str = ""  # the state last written (summary.state): a change to 'suspected' is announced once
    resource_version: str | None = None  # None: not created yet

    @property
    def released_at(self) -> float | None:
        return parse_time(self.fence.released_at) if self.fence is not None else None

    @property
    def known_keys(self) -> set[str]:
        return {i.key for i in self.incidents}

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> LedgerEntry:
        meta = obj.get("metadata") or {}
        node = _dict(obj.get("node"))
        raw = obj.get("incidents")
        incidents = [i for i in (incident_from_json(x) for x in (raw if isinstance(raw, list) else [])) if i]
        summary = _dict(obj.get("summary"))
        return cls(node=str(node.get("name") or meta.get("name") or ""), pool=_clip(node.get("pool"), 253),
                   incidents=incidents, fence=FenceRecord.from_json(obj.get("fence")),
                   state=str(summary.get("state") or ""), resource_version=meta.get("resourceVersion"))

    def to_object(self, assessment: Assessment, now: float) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "apiVersion": f"{names.REPORT_GROUP}/{names.REPORT_VERSION}",
            "kind": names.NODE_LEDGER_KIND,
            "metadata": {"name": self.node, "labels": {"app.kubernetes.io/managed-by": names.COMPONENT}},
            "node": {"name": self.node, "pool": self.pool},
            "summary": {
                "score": assessment.score, "scoreAt": rfc3339(now), "incidents": assessment.incidents,
                "distinctJobs": assessment.jobs, "distinctNamespaces": assessment.namespaces,
                "nodeSourced": assessment.node_sourced,
                "lastIncident": rfc3339(assessment.last_incident) if assessment.last_incident is not None else None,
                "state": assessment.state.value, "why": _clip(assessment.why),
            },
            "incidents": [incident_to_json(i) for i in self.incidents],
        }
        if self.fence is not None:
            obj["fence"] = self.fence.to_json()
        if self.resource_version:
            obj["metadata"]["resourceVersion"] = self.resource_version
        return obj
