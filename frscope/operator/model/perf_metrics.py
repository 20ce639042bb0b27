"""Where a watched job's time goes (`frscope analyze --perf` over its live window), as Prometheus gauges.

Only jobs with a live window (someone has their page open: `serve.live_windows`) have series, and they
are removed when the window goes. Labels stay bounded: the job's namespace and name, a closed `part`,
and the rank only for the `TOP_RANKS` ranks that cost the job most (their series replaced as they change).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Gauge

TOP_RANKS = 3
_JOB = ("namespace", "training_job")


def _seconds(value: Any) -> float | None:
    return value / 1000.0 if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class PerfMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.window = Gauge(
            "frscope_operator_job_perf_window_seconds",
            "The span of a watched job's live window that its collective time is counted over (first "
            "counted collective's creation to the last one's end).", _JOB, registry=registry)
        self.collective = Gauge(
            "frscope_operator_job_perf_collective_seconds",
            "Time in collectives in a watched job's live window, by part: wait (rank-seconds the ranks waited "
            "for late peers, summed over the ranks: compute-side) and transfer (wall seconds once all were "
            "there, summed over the collectives: network-side; absent where the recorder has no timing).",
            (*_JOB, "part"), registry=registry)
        self.rank_cost = Gauge(
            "frscope_operator_job_perf_rank_cost_seconds",
            f"The time the {TOP_RANKS} ranks that cost a watched job most made the others wait, in its live "
            "window (frscope analyze --perf's first line).", (*_JOB, "rank"), registry=registry)
        self._ranks: dict[tuple[str, str], set[str]] = {}
        self._parts: dict[tuple[str, str], set[str]] = {}

    def update(self, namespace: str, job: str, perf: dict[str, Any] | None) -> None:
        """The job's latest window's numbers (`report.perf.perf_to_dict`); None: it has none (yet)."""
        if perf is None:
            self.remove(namespace, job)
            return
        key = (namespace, job)
        window = _seconds(perf.get("window_ms"))
        if window is not None:
            self.window.labels(namespace, job).set(window)
        parts = {part: value for part in ("wait", "transfer")
                 if (value := _seconds(perf.get(f"{part}_ms"))) is not None}
        for part in self._parts.get(key, set()) - set(parts):
            self.collective.remove(namespace, job, part)
        for part, value in parts.items():
            self.collective.labels(namespace, job, part).set(value)
        self._parts[key] = set(parts)
        costs = [c for c in perf.get("costs") or [] if isinstance(c, dict) and isinstance(c.get("rank"), int)]
        top = {str(c["rank"]): cost for c in costs[:TOP_RANKS] if (cost := _seconds(c.get("cost_ms"))) is not None}
        for rank in self._ranks.get(key, set()) - set(top):
            self.rank_cost.remove(namespace, job, rank)
        for rank, cost in top.items():
            self.rank_cost.labels(namespace, job, rank).set(cost)
        self._ranks[key] = set(top)

    def remove(self, namespace: str, job: str) -> None:
        key = (namespace, job)
        for rank in self._ranks.pop(key, set()):
            self.rank_cost.remove(namespace, job, rank)
        for part in self._parts.pop(key, set()):
            self.collective.remove(namespace, job, part)
        try:
            self.window.remove(namespace, job)
        except KeyError:
            pass
