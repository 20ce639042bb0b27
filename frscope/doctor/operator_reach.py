"""Could the operator reach the job's sidecars? Read from what it publishes: its `SidecarsUnreachable`
Warning Events, written when a gather missed pods (the pods and why are in the message)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from frscope.doctor.result import CheckResult, failed, passed
from frscope.operator import names
from frscope.operator.kube.api_client import KubeClient
from frscope.operator.kube.resources import EVENTS

RECENT = datetime.timedelta(hours=1)


def _when(event: Mapping[str, Any]) -> datetime.datetime | None:
    for field in (event.get("lastTimestamp"), event.get("eventTime"),
                  (event.get("metadata") or {}).get("creationTimestamp")):
        if isinstance(field, str) and field:
            try:
                return datetime.datetime.fromisoformat(field.replace("Z", "+00:00"))
            except ValueError:
                continue
    return None


def recent_unreachable(events: Sequence[Mapping[str, Any]], now: datetime.datetime,
                       job: str | None = None) -> list[Mapping[str, Any]]:
    """The operator's SidecarsUnreachable Events of the last hour (of `job` when given), newest first."""
    chosen = []
    for event in events:
        when = _when(event)
        if event.get("reason") != names.REASON_SIDECARS_UNREACHABLE or when is None or now - when > RECENT:
            continue
        if job is not None and (event.get("involvedObject") or {}).get("name") != job:
            continue
        chosen.append((when, event))
    return [e for _, e in sorted(chosen, key=lambda pair: pair[0], reverse=True)]


async def operator_reaches_sidecars(client: KubeClient, namespace: str, job: str | None) -> CheckResult:
    events = await client.list(EVENTS, namespace, field_selector=f"reason={names.REASON_SIDECARS_UNREACHABLE}")
    found = recent_unreachable(events, datetime.datetime.now(datetime.UTC), job)
    what = f"job {job}" if job else f"namespace {namespace}"
    if found:
        latest = found[0]
        return failed("operator-reach", f"the operator could not gather from sidecars of {what} "
                      f"({len(found)} time(s) in the last hour); latest: {latest.get('message', '')}",
                      "check that the NetworkPolicy in the namespace admits the operator on port "
                      f"{names.SIDECAR_PORT_NAME} and the sidecars' logs (docs/runbooks.md)")
    return passed("operator-reach", f"the operator reported no unreachable sidecar of {what} in the last hour")
