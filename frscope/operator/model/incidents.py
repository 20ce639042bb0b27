"""One incident, one diagnosis: however many signals arrive, and across operator restarts.

An incident is (job uid, attempt, stuck group, stuck sequence id). The attempt names one run of the
job's pods: the generation of pods (a digest of their uids: recreated pods are a new attempt), the
trainer run inside them (container restarts) and torchrun's restarts of its workers inside that run
(`--max-restarts`: the same group and sequence id hang again in new processes). The report's object
name is derived from the incident, so a half-finished publish that is retried after a restart finds
its own report instead of making a second one.

The incidents already diagnosed are the job's FlightRecorderReports (their `job` section names the
incident): the operator watches them and rebuilds each job's ledger from them after a restart, so it
needs no write permission on the job itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

MAX_RECORDS = 16


@dataclass(frozen=True, slots=True)
class Attempt:
    pods: str  # digest of the pods' uids
    run: int  # trainer run inside those pods (restartCount)
    restarts: int = 0  # torchrun's worker-group restarts inside that run (TORCHELASTIC_RESTART_COUNT)

    def __str__(self) -> str:
        return f"{self.pods}/r{self.run}" + (f"t{self.restarts}" if self.restarts else "")


@dataclass(frozen=True, slots=True)
class IncidentKey:
    job_uid: str
    attempt: Attempt
    group: str
    seq: int | None

    @property
    def digest(self) -> str:
        text = f"{self.job_uid}|{self.attempt}|{self.group}|{self.seq}"
        return hashlib.sha256(text.encode()).hexdigest()[:10]


@dataclass(frozen=True, slots=True)
class IncidentRecord:
    """What the job's annotation remembers about one diagnosed incident."""

    id: str  # IncidentKey.digest
    attempt: str
    group: str
    seq: int | None
    category: str
    report: str
    at: str  # RFC 3339

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> IncidentRecord | None:
        if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
            return None
        seq = obj.get("seq")
        return cls(
            id=obj["id"], attempt=str(obj.get("attempt") or ""), group=str(obj.get("group") or ""),
            seq=seq if isinstance(seq, int) else None, category=str(obj.get("category") or ""),
            report=str(obj.get("report") or ""), at=str(obj.get("at") or ""),
        )


@dataclass(frozen=True, slots=True)
class ReportFacts:
    """What a FlightRecorderReport object says about its job and incident (None where unreadable)."""

    namespace: str
    job: str
    job_uid: str
    record: IncidentRecord
    condition: tuple[str, str] | None  # (reason, message) asserted on the job


def report_facts(obj: dict[str, Any]) -> ReportFacts | None:
    """Read a report object back into the ledger's terms; None for one frscope did not write, and for a
    job's suspicion report (`job.suspicion`: what a suspected stall's gather found, no incident)."""
    meta = obj.get("metadata") or {}
    job = obj.get("job") or {}
    what = (obj.get("diagnosis") or {}).get("what") or {}
    if not isinstance(job, dict) or not isinstance(what, dict) or job.get("suspicion") is True:
        return None
    incident, name, uid = job.get("incident"), job.get("name"), job.get("uid")
    if not all(isinstance(v, str) and v for v in (incident, name, uid, meta.get("namespace"), meta.get("name"))):
        return None
    seq = what.get("collectiveSeqId")
    record = IncidentRecord(
        id=str(incident), attempt=str(job.get("attempt") or ""), group=str(job.get("processGroupName") or ""),
        seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
        category=str(what.get("category") or ""), report=str(meta["name"]), at=str(job.get("gatheredAt") or ""),
    )
    cond = job.get("condition")
    condition = None
    if isinstance(cond, dict) and cond.get("reason"):
        condition = (str(cond["reason"]), str(cond.get("message") or ""))
    return ReportFacts(str(meta["namespace"]), str(name), str(uid), record, condition)


class Ledger:
    """The incidents recorded for one job (from its report objects, and what this process published)."""

    def __init__(self, records: list[IncidentRecord] | None = None) -> None:
        self.records: list[IncidentRecord] = list(records or [])

    def has(self, key: IncidentKey) -> bool:
        return any(r.id == key.digest for r in self.records)

    def has_attempt(self, attempt: Attempt) -> bool:
        return any(r.attempt == str(attempt) for r in self.records)

    def has_seq(self, attempt: Attempt, group: str | None, seq: int | None) -> bool:
        """True when this attempt's recorded incident is about that group and sequence id."""
        return any(
            r.attempt == str(attempt) and (group is None or r.group == group) and r.seq == seq
            for r in self.records
        )

    def reports_of(self, attempt: Attempt) -> list[str]:
        """The reports of this attempt's diagnosed incidents (where their action records live)."""
        return [r.report for r in self.records if r.attempt == str(attempt) and r.report]

    def with_record(self, record: IncidentRecord) -> Ledger:
        kept = [r for r in self.records if r.id != record.id]
        return Ledger(sorted(kept + [record], key=lambda r: r.at)[-MAX_RECORDS:])

    def without(self, incident: str) -> Ledger:
        return Ledger([r for r in self.records if r.id != incident])
