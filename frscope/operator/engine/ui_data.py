"""What the web UI shows of a job's latest diagnosis (`model.store.LatestDiagnosis`), built once per
diagnosis: the report as JSON and the collective timeline, off the event loop; the recorders
themselves are then let go."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from frscope.analysis import Report
from frscope.operator.engine.jobstate import job_fields
from frscope.operator.evidence.diagnosis import Diagnosis
from frscope.operator.model.objects import JobKey
from frscope.operator.model.store import LatestDiagnosis
from frscope.records import DumpSet
from frscope.report import report_to_dict
from frscope.report.timeline import build_timeline

log = logging.getLogger(__name__)


async def latest_diagnosis(key: JobKey, incident: str, diagnosis: Diagnosis, report_name: str,
                           at: str) -> LatestDiagnosis:
    report = diagnosis.report
    finding = report.findings[0]
    return LatestDiagnosis(
        incident=incident, category=finding.category.value, verdict=finding.summary,
        culprit_ranks=tuple(finding.culprit_ranks), report_name=report_name, at=at,
        report=report_to_dict(report), timeline=await _timeline(key, diagnosis.dumpset, report))


async def _timeline(key: JobKey, dumpset: DumpSet, report: Report) -> dict[str, Any] | None:
    try:
        return await asyncio.to_thread(build_timeline, dumpset, report)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("job %s: building the timeline failed", key, extra=job_fields(key))
        return None
