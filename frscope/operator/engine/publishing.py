"""A diagnosis written into the cluster: the report object, the job's condition and Events
(`publish.Publisher` does the writes), then the controller's memory of it (ledger, revision basis, the
condition to keep asserted), the metrics and what the web UI shows."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any

from frscope.operator import names
from frscope.operator.actions import Impact, culprit_placement, job_timeout
from frscope.operator.engine.jobstate import Basis, JobState, job_fields
from frscope.operator.engine.revisions import published_basis
from frscope.operator.engine.ui_data import latest_diagnosis
from frscope.operator.evidence.diagnosis import Diagnosis
from frscope.operator.evidence.incident_bundles import IncidentBundles
from frscope.operator.kube import KubeError
from frscope.operator.model.incidents import Attempt, IncidentKey, IncidentRecord
from frscope.operator.model.objects import JobKey
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.model.signals import Signal
from frscope.operator.model.store import JobStore, JobView
from frscope.operator.publish import JobGone, Publication, Publisher, build_report_cr, clip_line, report_name
from frscope.report import one_line

log = logging.getLogger(__name__)


def rfc3339(now: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(time.time() if now is None else now, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class DiagnosisWriter:
    def __init__(self, publisher: Publisher, metrics: OperatorMetrics, store: JobStore, *,
                 report_limit_bytes: int, default_watchdog_timeout_s: float | None,
                 bundles: IncidentBundles | None = None) -> None:
        self.publisher = publisher
        self.bundles = bundles  # each incident's evidence kept as one file (--evidence-dir)
        self.metrics = metrics
        self.store = store
        self.report_limit_bytes = report_limit_bytes
        self.default_watchdog_timeout_s = default_watchdog_timeout_s

    def _impact(self, view: JobView, diagnosis: Diagnosis, rank_pods: dict[int, str]) -> Impact:
        finding = diagnosis.report.findings[0]
        timeout_s, source = job_timeout(diagnosis.dumpset, finding, view.pods, diagnosis.report.backend,
                                        self.default_watchdog_timeout_s)
        culprit_pods, culprit_nodes, by_node = culprit_placement(finding, rank_pods, view.pods)
        ranks = view.world_size or diagnosis.report.world_size
        return Impact(timeout_s, source, sum(p.gpus for p in view.pods), ranks, culprit_pods, culprit_nodes, by_node)

    def _publication(self, view: JobView, sig: Signal, attempt: Attempt, key: IncidentKey, diagnosis: Diagnosis,
                     rank_pods: dict[int, str], revision: Basis | None, now: str) -> Publication:
        report = diagnosis.report
        finding = report.findings[0]
        incident = revision.record.id if revision is not None else key.digest
        name = report_name(view.ref, incident)
        record = IncidentRecord(incident, str(attempt), key.group, key.seq, finding.category.value, name, now)
        message = one_line(finding)
        obj = build_report_cr(view.ref, report, incident=incident, attempt=str(attempt),
                              signal=f"{sig.kind.value}: {sig.detail}", missing_pods=diagnosis.missing_pods,
                              gathered_at=now, limit_bytes=self.report_limit_bytes,
                              condition=(finding.category.value, message),
                              impact=self._impact(view, diagnosis, rank_pods).to_json(),
                              revision=revision.revisions if revision is not None else 0)
        events: list[tuple[str, str]] = [(finding.category.value, message)]
        if revision is not None:
            before = revision.record
            events.append((names.REASON_REVISED, clip_line(
                f"report {name} revised with trainer ends the kubelet reported after it was written: "
                f"{before.category} (group {before.group}, seq {before.seq}) -> {finding.category.value}: "
                f"{message}")))
        if diagnosis.missing_pods:
            listed = ", ".join(f"{pod} ({why})" for pod, why in sorted(diagnosis.missing_pods.items()))
            events.append((names.REASON_SIDECARS_UNREACHABLE,
                           clip_line(f"{len(diagnosis.missing_pods)} pod(s) could not be gathered; the report "
                                     f"names their ranks as missing: {listed}")))
        return Publication(view.ref, record, obj, finding.category.value, message, tuple(events),
                           event_incident=f"{incident}-r{revision.revisions}" if revision is not None else incident)

    async def write(self, view: JobView, state: JobState, sig: Signal, attempt: Attempt, key: IncidentKey,
                    diagnosis: Diagnosis, rank_pods: dict[int, str], revision: Basis | None = None) -> str | None:
        """Write the report, the condition and the Events; `revision`: rewrite that published report
        (same object and incident id) instead of making a new one. The report's name when it was
        written (its action may follow: only once the evidence is written), else None."""
        report = diagnosis.report
        finding = report.findings[0]
        now = rfc3339()
        publishing = time.monotonic()
        # Off the event loop: the report of 1,000s of ranks takes seconds to build and size.
        pub = await asyncio.to_thread(self._publication, view, sig, attempt, key, diagnosis, rank_pods, revision, now)
        name = pub.record.report
        done = await (self.publisher.revise(pub) if revision is not None else self.publisher.publish(pub))
        for step in done.errors:
            self.metrics.publish_errors.labels(step=step.split(" ")[0]).inc()
        log.info("job %s: report %s built and published in %.1f s", view.key, name, time.monotonic() - publishing,
                 extra=job_fields(view.key))
        if done.report or done.condition:
            state.ledger = state.ledger.with_record(pub.record)
            published_basis(revision, state, attempt, pub.record, report, view, len(rank_pods))
            state.asserted = (view.ref.uid, pub.condition)
            self.metrics.diagnoses.labels(category=finding.category.value).inc()
            self.metrics.job_diagnosed(view.key.namespace, view.key.name, finding.category.value)
        if done.condition and state.first_signal_at is not None:
            self.metrics.signal_to_publish.observe(time.monotonic() - state.first_signal_at)
            state.first_signal_at = None
        latest = await latest_diagnosis(view.key, key.digest, diagnosis, name if done.report else "", now)
        self.store.set_latest(view.key, latest)
        if self.bundles is not None:
            self.bundles.save_soon(view.ref, latest, diagnosis, rank_pods)
        log.warning("job %s: %s: %s (report %s)", view.key, finding.category.value, pub.condition_message, name,
                    extra=job_fields(view.key, key.digest))
        return name if done.report else None

    async def reassert(self, key: JobKey, ours: dict[str, Any]) -> None:
        """Put frscope's condition back first in the job's conditions (the training operator rewrote them)."""
        view = self.store.job(key)
        if view is None:
            return
        try:
            if await self.publisher.assert_condition(view.ref, ours):
                log.info("job %s: condition %s put back first in status.conditions", key, names.CONDITION_TYPE,
                         extra=job_fields(key))
        except JobGone:
            pass
        except KubeError as exc:
            self.metrics.publish_errors.labels(step="condition").inc()
            log.error("job %s: could not re-assert the condition: %s", key, exc, extra=job_fields(key))
