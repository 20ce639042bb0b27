"""A suspicion another operator process published: the job's suspicion report (`<job>-suspicion`) in
state Suspected, read back so that this process carries the suspicion on instead of publishing it again.

That process may have been the leader that was killed mid-incident (serve.leadership) or this replica
before a restart. Its report names the job (uid), the condition it asserted and when (`state.
lastTransitionTime`); the suspicion's Events are named from that time (`event_key`), so the same
suspicion's SuspectedStall, Resumed Events are the same objects whichever process posts them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from frscope.operator import names
from frscope.operator.actions.impact import parse_time
from frscope.operator.model.objects import JobRef
from frscope.operator.publish import report_name
from frscope.operator.publish.report_cr import is_suspicion_report


def event_key(at: str) -> str:
    """What a suspicion's Event names are made from: its publication time (RFC 3339), digits only."""
    return "s" + re.sub(r"\D", "", at)


@dataclass(frozen=True, slots=True)
class KeptSuspicion:
    report: str  # the report object's name
    at: str  # when the suspicion was published (RFC 3339)
    since_wall: float  # the same, seconds since the epoch
    condition: tuple[str, str]  # (reason, message) asserted on the job


def suspicion_report_name(ref: JobRef) -> str:
    return report_name(ref, names.SUSPICION_REPORT)


def kept_suspicion(ref: JobRef, obj: dict[str, Any] | None) -> KeptSuspicion | None:
    """The report `obj` (the job's suspicion report, or None where there is none) as a suspicion still
    under way: None unless it is of this job (uid) and in state Suspected."""
    if obj is None or not is_suspicion_report(obj):
        return None
    job, state = obj.get("job") or {}, obj.get("state") or {}
    if not isinstance(job, dict) or not isinstance(state, dict) or job.get("uid") != ref.uid:
        return None
    at = state.get("lastTransitionTime")
    since = parse_time(at)
    if state.get("phase") != names.REPORT_STATE_SUSPECTED or since is None:
        return None
    cond = job.get("condition")
    cond = cond if isinstance(cond, dict) else {}
    reason, message = str(cond.get("reason") or ""), str(cond.get("message") or state.get("message") or "")
    if not reason:
        return None
    return KeptSuspicion(str((obj.get("metadata") or {}).get("name") or suspicion_report_name(ref)), str(at), since,
                         (reason, message))
