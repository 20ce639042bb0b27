"""Bounded-rate polling of every watched pod's sidecar `/v1/status` (cheap), one operator-wide loop.

No kopf daemon or timer per job or pod (the operator does not own them): one task sweeps all jobs
every `interval_s`, starting at most `max_rps` requests per second with at most `concurrency` in
flight, and hands each job's answers to the controller, which turns a stall into a signal.
"""

from __future__ import annotations

import asyncio
import logging
import time

from frscope.operator.engine.controller import Controller
from frscope.operator.evidence.sidecars import SidecarError
from frscope.operator.model.objects import JobKey
from frscope.wire import SidecarStatus

log = logging.getLogger(__name__)


class StatusPoller:
    def __init__(self, controller: Controller, *, interval_s: float, timeout_s: float, max_rps: float,
                 concurrency: int) -> None:
        self._controller = controller
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._spacing_s = 1.0 / max_rps
        self._semaphore = asyncio.Semaphore(max(1, concurrency))
        self.sweeps = 0

    async def _one(self, key: JobKey, pod: str, endpoint: str) -> SidecarStatus | str:
        async with self._semaphore:
            try:
                status = await self._controller.sidecars.status(endpoint, self._timeout_s,
                                                                pod=(key.namespace, pod))
            except SidecarError as exc:
                self._controller.metrics.status_poll_errors.inc()
                log.debug("status poll failed: %s", exc)
                return exc.message
            except Exception as exc:  # one pod's answer never ends the sweep for the others
                self._controller.metrics.status_poll_errors.inc()
                log.warning("status poll of %s failed: %s", endpoint, type(exc).__name__)
                return f"unreadable answer ({type(exc).__name__})"
        if status.stalls:
            # A job's first stall is signalled on the answer that reports it, not at the sweep's end.
            self._controller.on_first_stall(key, pod, status)
        elif status.suspects:
            self._controller.on_first_suspect(key, pod, status)
        return status

    async def sweep(self) -> None:
        """Poll every pod with a sidecar endpoint once; report per job."""
        per_job: dict[JobKey, dict[str, asyncio.Task[SidecarStatus | str]]] = {}
        cut_short: set[JobKey] = set()
        try:
            for view in self._controller.store.jobs():
                for pod in view.pods:
                    if self._controller.handling(view.key):
                        # Its incident is being handled: the gather is asking these sidecars for more
                        # already, and polling them too would only compete with it (at 8,192 pods a
                        # sweep's polls ran beside the whole gather). The next sweep polls them again.
                        cut_short.add(view.key)
                        break
                    endpoint = pod.endpoint
                    if endpoint is None or pod.deleting:
                        continue
                    task = asyncio.create_task(self._one(view.key, pod.name, endpoint))
                    per_job.setdefault(view.key, {})[pod.name] = task
                    await asyncio.sleep(self._spacing_s)
            for key, tasks in per_job.items():
                await asyncio.gather(*tasks.values())
                if key in cut_short:
                    continue  # a partial sweep of a job under way: its answers would mark the rest unpolled
                results = {pod: task.result() for pod, task in tasks.items()}
                answers = {pod: st for pod, st in results.items() if isinstance(st, SidecarStatus)}
                failures = {pod: st for pod, st in results.items() if isinstance(st, str)}
                self._controller.on_status(key, answers, failures)
        finally:
            leftover = [t for tasks in per_job.values() for t in tasks.values() if not t.done()]
            for task in leftover:
                task.cancel()
            await asyncio.gather(*leftover, return_exceptions=True)
        self.sweeps += 1

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("status sweep failed")
            await asyncio.sleep(max(0.0, self._interval_s - (time.monotonic() - started)))
