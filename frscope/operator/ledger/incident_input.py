"""A published report (a FlightRecorderReport, as JSON) -> the node ledger's view of its incident
(`analysis.suspicion.IncidentInput`). Pure; the report is read defensively (it is an object anyone with
write access to reports could have shaped).

The nodes come from `impact.culpritRanksByNode` (node -> the culprit ranks that ran there). A report
written before that field existed names only `impact.culpritNodes`: each of those nodes is then taken
to hold every culprit rank. The culprits' ends come from the top finding's `exits` in the embedded JSON
report (`report.findings[0].exits`), where the report kept them.
"""

from __future__ import annotations

import datetime
from typing import Any

from frscope.analysis.suspicion import IncidentInput, RankEnd

MAX_NODES = 64
MAX_RANKS = 256
MAX_TEXT = 4096


def parse_time(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _rank(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        rank = int(value)
    except (TypeError, ValueError):
        return None
    return rank if 0 <= rank < 2**20 else None


def _ranks(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(sorted({r for r in (_rank(v) for v in value[:MAX_RANKS]) if r is not None}))


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def report_key(report: dict[str, Any]) -> str:
    meta = _dict(report.get("metadata"))
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def culprit_nodes(report: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    impact = _dict(report.get("impact"))
    by_node = impact.get("culpritRanksByNode")
    if isinstance(by_node, dict) and by_node:
        return {str(n): _ranks(r) for n, r in list(by_node.items())[:MAX_NODES] if isinstance(n, str) and n}
    culprits = _ranks(_dict(_dict(report.get("diagnosis")).get("who")).get("culpritRanks"))
    nodes = impact.get("culpritNodes")
    if not isinstance(nodes, list):
        return {}
    return {n: culprits for n in nodes[:MAX_NODES] if isinstance(n, str) and n}


def culprit_ends(report: dict[str, Any]) -> dict[int, RankEnd]:
    findings = _dict(report.get("report")).get("findings")
    if not isinstance(findings, list) or not findings:
        return {}
    exits = _dict(_dict(findings[0]).get("exits"))
    out: dict[int, RankEnd] = {}
    for key, value in list(exits.items())[:MAX_RANKS]:
        rank = _rank(key)
        item = _dict(value)
        if rank is None or not item:
            continue
        code = item.get("exit_code")
        out[rank] = RankEnd(exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                            reason=_text(item.get("reason")), message=_text(item.get("message")))
    return out


def incident_from_report(report: dict[str, Any]) -> IncidentInput | None:
    """None for a report that implicates no node (healthy, or its culprits' nodes unknown), and for a
    job's suspicion report (`job.suspicion`: not an incident, whatever its state)."""
    if _dict(report.get("job")).get("suspicion") is True:
        return None
    diagnosis = _dict(report.get("diagnosis"))
    what = _dict(diagnosis.get("what"))
    category = what.get("category")
    if not isinstance(category, str) or not category or category == "Healthy":
        return None
    nodes = culprit_nodes(report)
    if not nodes:
        return None
    job = _dict(report.get("job"))
    meta = _dict(report.get("metadata"))
    at = parse_time(job.get("gatheredAt")) or parse_time(meta.get("creationTimestamp"))
    if at is None:
        return None
    return IncidentInput(
        key=report_key(report), job=f"{meta.get('namespace') or ''}/{_text(job.get('name'))[:253]}",
        job_uid=_text(job.get("uid"))[:64], at=at, category=category[:64], ambiguous=what.get("ambiguous") is True,
        nodes=nodes, exits=culprit_ends(report))
