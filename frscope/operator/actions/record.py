"""The action record: what frscope did about one incident, kept in the incident's report
(`FlightRecorderReport.action`). It is the durable memory that makes an action happen once:

    state 'acting'  written (with a resourceVersion precondition) before anything is changed: the claim
    state 'done' / 'failed' / 'skipped' / 'dry-run'  written after

An operator that finds 'acting' (it or another crashed mid-action) finishes the same, idempotent
action on the same targets (pods by uid, the same node) and writes 'done'; any other state is final.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from frscope.operator.actions.impact import parse_time
from frscope.operator.actions.policy import ACTIONS, Policy

MAX_TARGETS = 1024

ACTING = "acting"
DONE = "done"
FAILED = "failed"
SKIPPED = "skipped"
DRY_RUN = "dry-run"
FINAL = (DONE, FAILED, SKIPPED, DRY_RUN)


@dataclass(frozen=True, slots=True)
class ActionRecord:
    requested: str  # the policy asked for
    source: str  # where it was asked for
    action: str  # what is carried out: restart | stop | cordon | dry-run | none
    state: str
    why: str
    at: str  # RFC 3339, the claim
    targets: tuple[str, ...] = ()  # 'pod/<name>/<uid>', 'job/<name>', 'node/<name>'
    done_at: str = ""
    saved_seconds: float = 0.0
    saved_gpu_seconds: float = 0.0
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {"requested": data["requested"], "source": data["source"], "action": data["action"],
                "state": data["state"], "why": data["why"], "at": data["at"], "doneAt": data["done_at"],
                "targets": list(self.targets[:MAX_TARGETS]), "savedSeconds": data["saved_seconds"],
                "savedGpuSeconds": data["saved_gpu_seconds"], "message": data["message"]}

    @classmethod
    def from_json(cls, obj: Any) -> ActionRecord | None:
        if not isinstance(obj, dict) or not isinstance(obj.get("state"), str):
            return None
        targets = obj.get("targets")
        return cls(
            requested=str(obj.get("requested") or ""), source=str(obj.get("source") or ""),
            action=str(obj.get("action") or ""), state=str(obj["state"]), why=str(obj.get("why") or ""),
            at=str(obj.get("at") or ""), done_at=str(obj.get("doneAt") or ""),
            targets=tuple(str(t) for t in targets) if isinstance(targets, list) else (),
            saved_seconds=float(obj.get("savedSeconds") or 0.0),
            saved_gpu_seconds=float(obj.get("savedGpuSeconds") or 0.0), message=str(obj.get("message") or ""),
        )

    def finished(self, state: str, now: str, message: str = "", **changes: Any) -> ActionRecord:
        return replace(self, state=state, done_at=now, message=message or self.message, **changes)

    @property
    def counts_against_rate(self) -> bool:
        """A change to the cluster was made, or claimed (rate limits count attempts, not successes)."""
        return self.action in {p.value for p in ACTIONS} and self.state in (ACTING, DONE, FAILED)


def unfinished(action: Any) -> bool:
    """Whether a report's `action` (as JSON) is a claim whose outcome was never written: an operator
    died between claiming and recording (its successor finishes the same action)."""
    record = ActionRecord.from_json(action)
    return record is not None and record.state not in FINAL


def restarted_pods(action: Any) -> dict[str, str]:
    """uid -> name of the pods a restart deleted or is deleting (a report's `action`, as JSON): the
    targets of a restart claimed or done. A failed one may have deleted some of them too."""
    record = ActionRecord.from_json(action)
    if record is None or record.action != Policy.RESTART.value or record.state not in (ACTING, DONE, FAILED):
        return {}
    out: dict[str, str] = {}
    for target in record.targets:
        kind, _, rest = target.partition("/")
        name, _, uid = rest.partition("/")
        if kind == "pod" and name and uid:
            out[uid] = name
    return out


def actions_since(reports: Iterable[dict[str, Any]], since: float, *, action: Policy | None = None) -> int:
    """How many reports carry an action (of that kind) claimed at or after `since` (epoch seconds)."""
    count = 0
    for report in reports:
        record = ActionRecord.from_json(report.get("action"))
        if record is None or not record.counts_against_rate:
            continue
        if action is not None and record.action != action.value:
            continue
        at = parse_time(record.at)
        if at is not None and at >= since:
            count += 1
    return count
