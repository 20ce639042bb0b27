"""Snapshots that sidecars pushed to `POST /v1/push`: kept (normalized, bounded) until a gather uses them.

A pushed snapshot is evidence the operator may otherwise lose (the pod can be deleted right after the
trainer exits), so gathers prefer a fresh fetch but fall back on the latest push of each pod.

In a push storm (the watchdog fires in a 1,250-pod job and every sidecar pushes within seconds) the
store does not evict evidence a gather has not had time to use: entries younger than `hold_s` are held,
and a push that does not fit past them (in the whole budget, or in its job's quota) is refused with
`Full`, which the HTTP server answers 429 + Retry-After; the sidecars' pusher waits that long and
retries. Older entries are evicted oldest first, as before.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from frscope.operator.evidence.pod_evidence import PodEvidence


@dataclass(frozen=True, slots=True)
class Pushed:
    evidence: PodEvidence
    received_monotonic: float


class Full(Exception):
    """No room for a push now: the budget (or the job's quota) is held by evidence younger than
    `hold_s`. `retry_after_s` is when the oldest held entry becomes evictable (whole seconds, >= 1)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class PushStore:
    """Latest push per (namespace, pod), oldest evicted first past `max_bytes` or `ttl_s`, except entries
    younger than `hold_s`: past them a push is refused (`Full`). A job's pushes together may hold at most
    `job_max_bytes`, so one job's storm cannot push out every other job's evidence. Bytes are what the
    bodies keep (`PodEvidence.held_bytes`: a push of 2,000 entries a rank keeps its newest 200)."""

    def __init__(self, *, max_bytes: int = 512 * 1024 * 1024, ttl_s: float = 6 * 3600.0,
                 hold_s: float = 300.0, job_max_bytes: int | None = None,
                 on_drop: Callable[[str, str], None] | None = None) -> None:
        self._items: OrderedDict[tuple[str, str], Pushed] = OrderedDict()
        self._jobs: dict[tuple[str, str], str] = {}  # (namespace, pod) -> its job's name, when known
        self._bytes = 0
        self._max_bytes = max_bytes
        self._ttl_s = ttl_s
        self._hold_s = hold_s
        self._job_max_bytes = job_max_bytes if job_max_bytes is not None else max_bytes // 4
        self._on_drop = on_drop  # (namespace, pod) of each evicted push: its copy on disk goes too

    def __len__(self) -> int:
        return len(self._items)

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def put(self, evidence: PodEvidence, job: str | None = None) -> None:
        """Keep `evidence` (replacing the pod's previous push), or raise `Full`. `job` is the pod's job
        name when the operator knows it (its pushes count against the job's quota)."""
        key = (evidence.namespace, evidence.pod)
        now = time.monotonic()
        self._evict(now, room_for=evidence.held_bytes)
        old = self._items.get(key)
        freed = old.evidence.held_bytes if old is not None else 0
        if job is not None:
            mine = [k for k, j in self._jobs.items() if j == job and k[0] == evidence.namespace and k in self._items]
            used = sum(self._items[k].evidence.held_bytes for k in mine) - freed
            # (a job's only push always passes the quota: the body size is bounded by the HTTP server)
            if used + evidence.held_bytes > self._job_max_bytes and any(k != key for k in mine):
                oldest = min(self._items[k].received_monotonic for k in mine)
                raise Full(f"job {evidence.namespace}/{job} holds {used} bytes of pushed evidence "
                           f"(quota {self._job_max_bytes})", self._retry_after(oldest, now))
        if self._bytes - freed + evidence.held_bytes > self._max_bytes and self._items:
            oldest = next(iter(self._items.values())).received_monotonic
            raise Full(f"pushed evidence holds {self._bytes} bytes (budget {self._max_bytes})",
                       self._retry_after(oldest, now))
        if old is not None:
            del self._items[key]
            self._bytes -= freed
        self._items[key] = Pushed(evidence, now)
        self._bytes += evidence.held_bytes
        if job is not None:
            self._jobs[key] = job

    def _retry_after(self, oldest: float, now: float) -> int:
        return max(1, math.ceil(oldest + self._hold_s - now))

    def get(self, namespace: str, pod: str) -> PodEvidence | None:
        self._evict()
        item = self._items.get((namespace, pod))
        return item.evidence if item else None

    def for_namespace_pods(self, namespace: str, pods: set[str]) -> dict[str, PodEvidence]:
        self._evict()
        return {p: item.evidence for (ns, p), item in self._items.items() if ns == namespace and p in pods}

    def discard(self, namespace: str, pod: str, uid: str) -> bool:
        """Drop the pod's push if it came from the pod of that uid (or does not say which): the pod was
        ended on purpose and what it pushed is not evidence of anything after. Returns whether it went."""
        item = self._items.get((namespace, pod))
        if item is None or item.evidence.pod_uid not in ("", uid):
            return False
        del self._items[(namespace, pod)]
        self._jobs.pop((namespace, pod), None)
        self._bytes -= item.evidence.held_bytes
        if self._on_drop is not None:
            self._on_drop(namespace, pod)
        return True

    def _evict(self, now: float | None = None, room_for: int = 0) -> None:
        """Drop entries past `ttl_s`, then the oldest ones past `hold_s` while over budget (counting
        `room_for` bytes about to arrive)."""
        now = time.monotonic() if now is None else now
        while self._items:
            key, first = next(iter(self._items.items()))
            age = now - first.received_monotonic
            over = self._bytes + room_for > self._max_bytes
            if age <= self._ttl_s and not (over and age >= self._hold_s):
                break
            self._items.pop(key)
            self._jobs.pop(key, None)
            self._bytes -= first.evidence.held_bytes
            if self._on_drop is not None:
                self._on_drop(*key)
