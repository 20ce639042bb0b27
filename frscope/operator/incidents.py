"""One incident, one diagnosis: however many signals arrive, and across operator restarts.

An incident is (job uid, attempt, stuck group, stuck sequence id). The attempt names one run of the
job's pods: the generation of pods (a digest of their uids: recreated pods are a new attempt) and
the trainer run inside them (container restarts). The incidents already diagnosed are kept in the
job's annotation `frscope.io/incidents` (bounded), which is what survives an operator restart; the
report's object name is derived from the incident, so a half-finished publish that is retried
after a restart finds its own report instead of making a second one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from frscope.operator import names

MAX_RECORDS = 16


@dataclass(frozen=True, slots=True)
class Attempt:
    pods: str  # digest of the pods' uids
    run: int  # trainer run inside those pods (restartCount)

    def __str__(self) -> str:
        return f"{self.pods}/r{self.run}"


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


class Ledger:
    """The incidents recorded on one job (read from, and rendered back into, its annotation)."""

    def __init__(self, records: list[IncidentRecord] | None = None) -> None:
        self.records: list[IncidentRecord] = list(records or [])

    @classmethod
    def from_annotations(cls, annotations: dict[str, Any] | None) -> Ledger:
        raw = (annotations or {}).get(names.ANN_INCIDENTS)
        if not isinstance(raw, str):
            return cls()
        try:
            items = json.loads(raw)
        except ValueError:
            return cls()  # someone edited it by hand: start over rather than fail
        records = [r for r in (IncidentRecord.from_json(i) for i in items if isinstance(items, list)) if r]
        return cls(records)

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

    def with_record(self, record: IncidentRecord) -> Ledger:
        kept = [r for r in self.records if r.id != record.id]
        return Ledger((kept + [record])[-MAX_RECORDS:])

    def render(self) -> str:
        return json.dumps([r.to_json() for r in self.records], separators=(",", ":"))
