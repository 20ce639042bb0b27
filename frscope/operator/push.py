"""Snapshots that sidecars pushed to `POST /v1/push`: kept (normalized, bounded) until a gather uses them.

A pushed snapshot is evidence the operator may otherwise lose (the pod can be deleted right after the
trainer exits), so gathers prefer a fresh fetch but fall back on the latest push of each pod.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from frscope.operator.evidence import PodEvidence


@dataclass(frozen=True, slots=True)
class Pushed:
    evidence: PodEvidence
    received_monotonic: float


class PushStore:
    """Latest push per (namespace, pod), oldest evicted first past `max_bytes` (of bodies) or `ttl_s`."""

    def __init__(self, *, max_bytes: int = 512 * 1024 * 1024, ttl_s: float = 6 * 3600.0) -> None:
        self._items: OrderedDict[tuple[str, str], Pushed] = OrderedDict()
        self._bytes = 0
        self._max_bytes = max_bytes
        self._ttl_s = ttl_s

    def __len__(self) -> int:
        return len(self._items)

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def put(self, evidence: PodEvidence) -> None:
        key = (evidence.namespace, evidence.pod)
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= old.evidence.size_bytes
        self._items[key] = Pushed(evidence, time.monotonic())
        self._bytes += evidence.size_bytes
        self._evict()

    def get(self, namespace: str, pod: str) -> PodEvidence | None:
        self._evict()
        item = self._items.get((namespace, pod))
        return item.evidence if item else None

    def for_namespace_pods(self, namespace: str, pods: set[str]) -> dict[str, PodEvidence]:
        self._evict()
        return {p: item.evidence for (ns, p), item in self._items.items() if ns == namespace and p in pods}

    def _evict(self) -> None:
        cutoff = time.monotonic() - self._ttl_s
        while self._items:
            key, first = next(iter(self._items.items()))
            if self._bytes <= self._max_bytes and first.received_monotonic >= cutoff:
                break
            self._items.pop(key)
            self._bytes -= first.evidence.size_bytes
