"""Report -> plain JSON-able dicts. The JSON output, the Markdown/HTML renderers, the operator's
FlightRecorderReport and the sidecar all use this one shape (documented in docs/report-json.md)."""

from __future__ import annotations

import math
from typing import Any

from frscope.analysis import Finding, Report, op_label
from frscope.analysis.findings import RankView
from frscope.records import Frame
from frscope.report.filters import Filters
from frscope.report.verdict import verdict

SCHEMA = "frscope.report/v1"


def frames_to_list(frames: tuple[Frame, ...]) -> list[dict[str, Any]]:
    return [{"name": f.name, "filename": f.filename, "line": f.line} for f in frames]


def _view(view: RankView) -> dict[str, Any]:
    return {
        "rank": view.rank,
        "op": view.op,
        "state": view.state,
        "input_sizes": view.input_sizes,
        "output_sizes": view.output_sizes,
        "input_dtypes": view.input_dtypes,
        "output_dtypes": view.output_dtypes,
        "time_created_ns": view.time_created_ns,
        "duration_ms": view.duration_ms,
        "last_enqueued_seq": view.last_enqueued_seq,
        "last_completed_seq": view.last_completed_seq,
        "activity": view.activity,
        "call_site": str(view.call_site) if view.call_site else None,
    }


def finding_to_dict(finding: Finding) -> dict[str, Any]:
    group = finding.process_group
    return {
        "category": finding.category.value,
        "bucket": finding.bucket.value,
        "culprit_ranks": list(finding.culprit_ranks),
        "ambiguous": finding.ambiguous,
        "would_decide": finding.would_decide,
        "process_group": {"name": group.name, "desc": group.desc, "ranks": list(group.ranks)},
        "collective_seq_id": finding.collective_seq_id,
        "p2p_seq_id": finding.p2p_seq_id,
        "op": finding.op,
        "op_label": op_label(finding.op) if finding.op else None,
        "input_sizes": finding.input_sizes,
        "output_sizes": finding.output_sizes,
        "input_dtypes": finding.input_dtypes,
        "output_dtypes": finding.output_dtypes,
        "summary": finding.summary,
        "evidence": list(finding.evidence),
        "since_ns": finding.since_ns,
        "stalled_for_s": finding.stalled_for_s,
        "late_by_ms": finding.late_by_ms,
        "age_source": finding.age_source,
        "late_at": [
            {"collective_seq_id": a.collective_seq_id, "op": a.op, "late_by_ms": round(a.late_by_ms, 1),
             "waited_ms": round(a.waited_ms, 1)}
            for a in finding.late_at
        ],
        "late_count": finding.late_count,
        "last_seen_ns": finding.last_seen_ns,
        "stale_by_s": finding.stale_by_s,
        "exits": {str(r): e.to_dict() for r, e in sorted(finding.exits.items())},
        "ranks": {str(r): _view(v) for r, v in sorted(finding.ranks.items())},
        "culprit_frames": {str(r): frames_to_list(f) for r, f in sorted(finding.culprit_frames.items())},
        "culprit_stacks": {str(r): frames_to_list(f) for r, f in sorted(finding.culprit_stacks.items())},
        "consequences": [finding_to_dict(c) for c in finding.consequences],
    }


def finite(obj: Any) -> Any:
    """`obj` with every NaN/inf float replaced by None: JSON has no NaN, and a bare `NaN` makes the
    whole document unreadable to strict parsers. Normalization already drops them from the records;
    this keeps any derived number (a median, a sum past the float range) from breaking the output."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def report_to_dict(
    report: Report, *, findings: list[Finding] | None = None, filters: Filters | None = None
) -> dict[str, Any]:
    """The report as JSON-able data, with no NaN or infinity anywhere (`finite`). `findings`: those `filters`
    kept; `healthy` and `verdict` stay the whole job's, and with active filters the document says which
    (`filters`) and how many findings the job has (`findings_total`)."""
    out = _report_dict(report, findings)
    if filters is not None and filters.active:
        out["filters"] = filters.to_dict()
        out["findings_total"] = len(report.findings)
    return finite(out)  # type: ignore[no-any-return]


def _report_dict(report: Report, findings: list[Finding] | None) -> dict[str, Any]:
    shown = report.findings if findings is None else findings
    return {
        "schema": SCHEMA,
        "healthy": report.healthy,
        "verdict": verdict(report),
        "world_size": report.world_size,
        "ranks_loaded": list(report.ranks_loaded),
        "missing_ranks": list(report.missing_ranks),
        "backend": report.backend,
        "versions": list(report.versions),
        "findings": [finding_to_dict(f) for f in shown],
        "groups": [
            {
                "name": g.group.name,
                "desc": g.group.desc,
                "ranks": list(g.group.ranks),
                "membership_source": g.membership_source,
                "progress": {
                    str(r): {
                        "last_enqueued_seq": p.last_enqueued_seq,
                        "last_completed_seq": p.last_completed_seq,
                        "inflight_op": p.inflight_op,
                        "inflight_seq": p.inflight_seq,
                    }
                    for r, p in g.ranks.items()
                },
            }
            for g in report.groups
        ],
        "problems": [
            {"source": p.source, "rank": p.rank, "kind": p.kind, "message": p.message} for p in report.problems
        ],
    }
