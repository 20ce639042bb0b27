"""Write a diagnosis into the cluster: the report object, the job's condition and Events. Every write
is idempotent (deterministic names, read-modify-write with resourceVersion), so a publish cut short
by a crash or an API error can simply run again.

Order matters for "exactly one report": the report is created first under a name derived from the
incident (it is also the ledger: the operator rebuilds which incidents it diagnosed from the reports
it watches), then the condition and Events follow. The job itself is only read, and its status
written through the status subresource: no write permission on the jobs themselves is needed. The
kind of the job (`JobRef.kind`: PyTorchJob, TrainJob, JobSet) says which resource and which
condition shape (jobkinds, condition.for_kind).
A job deleted meanwhile ends the publish quietly (`JobGone`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from frscope.operator import names
from frscope.operator.kube import (
    EVENTS,
    REPORTS,
    AlreadyExists,
    KubeClient,
    KubeError,
    NotFound,
    retry_on_conflict,
)
from frscope.operator.model.incidents import IncidentRecord
from frscope.operator.model.objects import JobRef, job_conditions
from frscope.operator.publish.condition import for_kind, make_condition, needs_write, place_condition
from frscope.operator.publish.events import build_event

log = logging.getLogger(__name__)


class JobGone(Exception):
    """The job was deleted (or replaced by one with another uid) before the publish finished."""


@dataclass(frozen=True, slots=True)
class Publication:
    """What to write for one incident."""

    job: JobRef
    record: IncidentRecord
    report_object: dict[str, Any]
    condition_reason: str
    condition_message: str
    events: tuple[tuple[str, str], ...]  # (reason, message)
    event_incident: str = ""  # what the Events' names are derived from (default: the incident id)
    # The condition asserted on the job, made once from the reason, message and the record's time (the
    # controller keeps asserting this same dict when the training operator rewrites the list).
    condition: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.condition:
            object.__setattr__(self, "condition",
                               make_condition(self.condition_reason, self.condition_message, self.record.at))


@dataclass(slots=True)
class Published:
    report: bool = False
    condition: bool = False
    events: int = 0
    errors: dict[str, str] = field(default_factory=dict)  # step -> error


class Publisher:
    def __init__(self, kube: KubeClient, *, instance: str,
                 seal: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self._kube = kube
        self._instance = instance
        # The node ledger's seal (ledger.seal): each incident report it writes carries the operator's HMAC.
        self._seal = seal or (lambda body: body)

    async def _job(self, ref: JobRef) -> dict[str, Any]:
        try:
            job = await self._kube.get(ref.job_kind.resource, ref.namespace, ref.name)
        except NotFound as exc:
            raise JobGone(f"job {ref.key} was deleted") from exc
        if ref.uid and (job.get("metadata") or {}).get("uid") != ref.uid:
            raise JobGone(f"job {ref.key} was replaced by a new object")
        return job

    async def publish(self, pub: Publication) -> Published:
        done = Published()
        await self._job(pub.job)  # JobGone before writing anything
        try:
            await self._kube.create(REPORTS, pub.job.namespace, self._seal(pub.report_object))
            done.report = True
        except AlreadyExists:
            done.report = True  # this incident's report was made before (a publish that is re-run)
        except KubeError as exc:
            done.errors["report"] = str(exc)
            log.error("job %s: could not create report %s: %s", pub.job.key, pub.record.report, exc)
        if not done.report:
            pub = _without_report(pub)
        try:
            await self._condition(pub)
            done.condition = True
        except JobGone:
            raise
        except KubeError as exc:
            done.errors["condition"] = str(exc)
            log.error("job %s: condition not written: %s", pub.job.key, exc)
        await self._events(pub, done)
        return done

    async def revise(self, pub: Publication) -> Published:
        """Rewrite the incident's report (read, then replaced at that resourceVersion: a concurrent
        writer, e.g. the actor recording its action, makes it read again and keeps its `action`), then
        the condition and the Events as `publish` does. A report deleted meanwhile is made again."""
        done = Published()
        await self._job(pub.job)

        async def cycle() -> None:
            try:
                current = await self._kube.get(REPORTS, pub.job.namespace, pub.record.report)
            except NotFound:
                await self._kube.create(REPORTS, pub.job.namespace, self._seal(pub.report_object))
                return
            body = self._seal(pub.report_object)
            meta = dict(body.get("metadata") or {})
            meta["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion")
            body["metadata"] = meta
            if "action" in current:
                body["action"] = current["action"]
            await self._kube.replace(REPORTS, pub.job.namespace, pub.record.report, body)

        try:
            await retry_on_conflict(cycle)
            done.report = True
        except JobGone:
            raise
        except KubeError as exc:
            done.errors["report"] = str(exc)
            log.error("job %s: could not revise report %s: %s", pub.job.key, pub.record.report, exc)
            return done  # the report keeps the verdict the condition states
        try:
            await self._condition(pub)
            done.condition = True
        except JobGone:
            raise
        except KubeError as exc:
            done.errors["condition"] = str(exc)
            log.error("job %s: condition not written: %s", pub.job.key, exc)
        await self._events(pub, done)
        return done

    async def _events(self, pub: Publication, done: Published) -> None:
        for reason, message in pub.events:
            try:
                await self.post_event(pub.job, reason=reason, message=message,
                                      incident=pub.event_incident or pub.record.id, now=pub.record.at,
                                      event_type="Normal" if reason == names.REASON_REVISED else "Warning")
                done.events += 1
            except KubeError as exc:
                done.errors[f"event {reason}"] = str(exc)
                log.error("job %s: Event %s not posted: %s", pub.job.key, reason, exc)

    async def _condition(self, pub: Publication) -> None:
        await self.assert_condition(pub.job, pub.condition)

    async def assert_condition(self, ref: JobRef, ours: dict[str, Any]) -> bool:
        """Put `ours` first in the job's conditions through the status subresource. False: no write needed."""

        async def cycle() -> bool:
            job = await self._job(ref)
            conditions = job_conditions(job)
            generation = (job.get("metadata") or {}).get("generation")
            shaped = for_kind(ours, ref.job_kind, generation if isinstance(generation, int) else None)
            if not needs_write(conditions, shaped):
                return False
            patch = {
                "metadata": {"resourceVersion": (job.get("metadata") or {}).get("resourceVersion")},
                "status": {"conditions": place_condition(conditions, shaped)},
            }
            await self._kube.merge_patch(ref.job_kind.resource, ref.namespace, ref.name, patch, subresource="status")
            return True

        return await retry_on_conflict(cycle)

    async def put_report(self, ref: JobRef, body: dict[str, Any]) -> None:
        """Create the report object, or replace the one of that name (the job's suspicion report, made
        again at each suspicion). Raises KubeError (JobGone if the job went first)."""
        await self._job(ref)
        name = body["metadata"]["name"]

        async def cycle() -> None:
            try:
                await self._kube.create(REPORTS, ref.namespace, body)
                return
            except AlreadyExists:
                pass
            current = await self._kube.get(REPORTS, ref.namespace, name)
            replaced = {**body, "metadata": {**body["metadata"],
                                             "resourceVersion": (current.get("metadata") or {}).get("resourceVersion")}}
            await self._kube.replace(REPORTS, ref.namespace, name, replaced)

        await retry_on_conflict(cycle)

    async def get_report(self, ref: JobRef, name: str) -> dict[str, Any] | None:
        """The report object of that name in the job's namespace; None if there is none."""
        try:
            return await self._kube.get(REPORTS, ref.namespace, name)
        except NotFound:
            return None

    async def set_report_state(self, ref: JobRef, name: str, patch: dict[str, Any]) -> bool:
        """Merge `patch` (report_cr.state_patch) into the report; False if it is gone."""
        try:
            await self._kube.merge_patch(REPORTS, ref.namespace, name, patch)
        except NotFound:
            return False
        return True

    async def post_event(self, ref: JobRef, *, reason: str, message: str, incident: str, now: str,
                         event_type: str = "Warning") -> None:
        body = build_event(ref, reason=reason, message=message, incident=incident, now=now, instance=self._instance,
                           event_type=event_type)
        try:
            await self._kube.create(EVENTS, ref.namespace, body)
        except AlreadyExists:
            pass  # posted before this publish was re-run


def _without_report(pub: Publication) -> Publication:
    record = IncidentRecord(pub.record.id, pub.record.attempt, pub.record.group, pub.record.seq,
                            pub.record.category, "", pub.record.at)
    return replace(pub, record=record)
