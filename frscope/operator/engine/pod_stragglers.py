"""Stragglers across pods: after each status sweep of a job, its sidecars' arrivals are merged
(JobArrivals) and compared (frscope.analysis.pod_lateness) in a worker thread, one job at a time each,
so the event loop only hands the answers over and posts the Events. A pod becoming a straggler is a
Warning Event `Straggler` naming its rank, the pod, its node and what it costs the job; it keeping up
again is a Normal `StragglerKeepsUp`. A pod late because of a rank its own sidecar already reports
(among its pod's ranks) gets no second Event.

While a job's comparison runs, newer answers wait (the newest per pod); the next comparison takes them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any

from frscope.analysis.lateness import MIN_SHARE
from frscope.analysis.pod_lateness import PodLateness, pod_lateness
from frscope.operator import names
from frscope.operator.engine.job_arrivals import JobArrivals
from frscope.operator.engine.jobstate import job_fields
from frscope.operator.engine.settings import OperatorConfig
from frscope.operator.model.objects import JobKey, JobRef
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.wire import SidecarStatus

log = logging.getLogger(__name__)

PostEvent = Callable[[JobRef, str, str, str, str], Coroutine[Any, Any, None]]


@dataclass(slots=True)
class PodStraggling:
    since_wall: float
    late: PodLateness


@dataclass(slots=True)
class JobPods:
    arrivals: JobArrivals = field(default_factory=JobArrivals)
    stragglers: dict[str, PodStraggling] = field(default_factory=dict)  # by pod
    pending: dict[str, SidecarStatus] = field(default_factory=dict)  # answers not compared yet
    nodes: dict[str, str] = field(default_factory=dict)  # the job's pods and their nodes, as last seen
    task: asyncio.Task[None] | None = None


def compare(arrivals: JobArrivals, statuses: dict[str, SidecarStatus], pods: Collection[str],
            unmeasured_bound_s: float, now_ns: int, min_share: float = MIN_SHARE) -> dict[str, PodLateness]:
    """Merge one sweep's answers and compare the job's pods (in a worker thread)."""
    arrivals.add(statuses, pods)
    if len(arrivals) < 2:
        return {}
    return pod_lateness(arrivals.arrivals(), arrivals.clocks(now_ns), ranks=arrivals.ranks(),
                        unmeasured_bound_s=unmeasured_bound_s, min_share=min_share)


class PodStragglers:
    def __init__(self, config: OperatorConfig, metrics: OperatorMetrics, post_event: PostEvent,
                 spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        self.config = config
        self.metrics = metrics
        self._post_event = post_event
        self._spawn = spawn
        self._jobs: dict[JobKey, JobPods] = {}

    def on_sweep(self, key: JobKey, ref: JobRef, statuses: dict[str, SidecarStatus], nodes: dict[str, str],
                 reported: Callable[[], Collection[int]]) -> None:
        """`nodes`: the job's pods and their nodes now; `reported`: the ranks the sidecars report as
        stragglers among their pods' ranks, asked when the comparison is done."""
        job = self._jobs.setdefault(key, JobPods())
        job.pending.update(statuses)
        job.nodes = nodes
        if job.task is None or job.task.done():
            job.task = self._spawn(self._run(key, job, ref, reported))

    def forget(self, key: JobKey) -> None:
        job = self._jobs.pop(key, None)
        if job is not None and job.task is not None:
            job.task.cancel()

    async def _run(self, key: JobKey, job: JobPods, ref: JobRef, reported: Callable[[], Collection[int]]) -> None:
        while job.pending:
            statuses, job.pending, nodes = job.pending, {}, job.nodes
            started = time.monotonic()
            found = await asyncio.to_thread(compare, job.arrivals, statuses, set(nodes),
                                            self.config.clock_skew_ms / 1000, time.time_ns(),
                                            self.config.straggler_min_share)
            self.metrics.lateness_compare_seconds.observe(time.monotonic() - started)
            if self._jobs.get(key) is not job:
                return  # forgotten meanwhile
            self._publish(key, job, ref, found, statuses, nodes, set(reported()))

    def _publish(self, key: JobKey, job: JobPods, ref: JobRef, found: dict[str, PodLateness],
                 statuses: dict[str, SidecarStatus], nodes: dict[str, str], reported: set[int]) -> None:
        now = {pod: late for pod, late in found.items() if late.straggler and late.rank not in reported}
        for pod, late in sorted(now.items()):
            if pod in job.stragglers:
                job.stragglers[pod].late = late
                continue
            job.stragglers[pod] = PodStraggling(time.time(), late)
            self.metrics.stragglers.inc()
            log.warning("job %s: %s", key, straggler_message(pod, nodes.get(pod), late), extra=job_fields(key))
            self._spawn(self._post_event(ref, names.REASON_STRAGGLER, straggler_message(pod, nodes.get(pod), late),
                                         f"podlate{late.rank}-{int(time.time() * 1000)}", "Warning"))
        for pod in [p for p in job.stragglers if p not in now and (p in statuses or p not in nodes)]:
            gone = job.stragglers.pop(pod)
            message = (f"rank {gone.late.rank} (pod {pod}) keeps up again with the other pods after "
                       f"{time.time() - gone.since_wall:.0f} s as a straggler")
            log.info("job %s: %s", key, message, extra=job_fields(key))
            self._spawn(self._post_event(ref, names.REASON_STRAGGLER_GONE, message,
                                         f"podkept{gone.late.rank}-{int(time.time() * 1000)}", "Normal"))


def straggler_message(pod: str, node: str | None, late: PodLateness) -> str:
    where = f" on node {node}" if node else ""
    ranks = ", ".join(str(r) for r in late.ranks)
    how = ("by their ranks' recorded waits" if late.by_waits == late.compared
           else "by enqueue times, each pod's clock offset measured and its bound taken off")
    return (f"rank {late.rank} (pod {pod}{where}, ranks {ranks}) is a straggler across pods: its pod arrives last "
            f"at {late.late} of the last {late.compared} collectives of group {late.group}, {late.lateness_s:.3f} s "
            f"after the other pods on average ({how}); it costs the job {100 * late.share:.0f}% of its time")
