"""An in-memory JobProvider: for tests, demos and as the reference implementation of the protocol."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from frscope.webui.provider import JobDetail, JobSummary, RankStatus


class MemoryProvider:
    """Jobs set by hand. Every `put()` makes a new immutable snapshot with a new revision."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], JobDetail] = {}
        self._counter = 0

    def put(
        self,
        namespace: str,
        name: str,
        *,
        report: dict[str, Any] | None = None,
        timeline: dict[str, Any] | None = None,
        ranks: dict[int, RankStatus] | None = None,
        state: str = "Running",
        stalled: bool | None = None,
    ) -> JobDetail:
        self._counter += 1
        findings = (report or {}).get("findings") or []
        first = findings[0] if findings else None
        summary = JobSummary(
            namespace=namespace,
            name=name,
            verdict=report.get("verdict") if report else None,
            healthy=report.get("healthy") if report else None,
            state=state,
            stalled=bool(findings) if stalled is None else stalled,
            category=first.get("category") if first else None,
            culprit_ranks=tuple(first.get("culprit_ranks", ())) if first else (),
            world_size=report.get("world_size") if report else None,
            updated_at=time.time(),
        )
        detail = JobDetail(summary, report, timeline, dict(ranks or {}), revision=f"r{self._counter}")
        self._jobs[(namespace, name)] = detail
        return detail

    def set_ranks(self, namespace: str, name: str, ranks: dict[int, RankStatus]) -> None:
        self._counter += 1
        old = self._jobs[(namespace, name)]
        self._jobs[(namespace, name)] = replace(old, ranks=dict(ranks), revision=f"r{self._counter}")

    def remove(self, namespace: str, name: str) -> None:
        self._jobs.pop((namespace, name), None)

    def jobs(self) -> list[JobSummary]:
        return [d.summary for _, d in sorted(self._jobs.items())]

    def job(self, namespace: str, name: str) -> JobDetail | None:
        return self._jobs.get((namespace, name))
