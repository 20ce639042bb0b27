"""What the web UI needs from whoever knows the jobs (the operator): the `JobProvider` protocol.

The provider answers from memory (the operator's store); both methods may be plain functions or
coroutines. Everything it returns is treated as read-only and may be shared between requests, so
return immutable snapshots (new objects when something changes, never mutated in place).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, TypeVar

T = TypeVar("T")
MaybeAwaitable: TypeAlias = T | Awaitable[T]


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One watched job in the list."""

    namespace: str
    name: str
    verdict: str | None = None  # the latest diagnosis in one sentence (report["verdict"]); None: none yet
    healthy: bool | None = None  # None: not diagnosed
    state: str = ""  # the training operator's state ('Running', 'Failed', ...)
    stalled: bool = False  # a sidecar reports no progress now
    category: str | None = None  # the root finding's category ('RankNotJoined', ...)
    culprit_ranks: tuple[int, ...] = ()
    world_size: int | None = None
    updated_at: float | None = None  # time.time() of the latest diagnosis or status

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "verdict": self.verdict,
            "healthy": self.healthy,
            "state": self.state,
            "stalled": self.stalled,
            "category": self.category,
            "culprit_ranks": list(self.culprit_ranks),
            "world_size": self.world_size,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, slots=True)
class RankStatus:
    """One rank as its sidecar sees it now. `state` is one of 'ok', 'idle', 'stalled', 'unreachable',
    'missing', 'failed' (others are shown, in grey); `detail` is one short line."""

    state: str
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"state": self.state, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class JobDetail:
    """One job's page: the latest report and timeline, and every rank's status now."""

    summary: JobSummary
    report: dict[str, Any] | None = None  # frscope.report.report_to_dict() shape
    timeline: dict[str, Any] | None = None  # frscope.report.timeline.build_timeline() shape
    ranks: dict[int, RankStatus] = field(default_factory=dict)
    perf: dict[str, Any] | None = None  # frscope.report.perf.perf_to_dict(): where the time goes
    # Must change whenever anything above changes; None: the web UI hashes the content (costs a JSON
    # encoding of the timeline per change check, cached per report/timeline object).
    revision: str | None = None

    def to_dict(self, revision: str) -> dict[str, Any]:
        return {
            "summary": self.summary.to_dict(),
            "report": self.report,
            "timeline": self.timeline,
            "status": {str(r): s.to_dict() for r, s in sorted(self.ranks.items())},
            "perf": self.perf,
            "revision": revision,
        }


class JobProvider(Protocol):
    """Implemented by the operator (over its job store); `frscope.webui.MemoryProvider` for tests."""

    def jobs(self) -> MaybeAwaitable[Sequence[JobSummary]]: ...

    def job(self, namespace: str, name: str) -> MaybeAwaitable[JobDetail | None]: ...


class _DigestCache:
    """Content digests of report/timeline objects, by identity (the objects are kept alive while cached,
    so an id is never reused for another object)."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._items: dict[int, tuple[object, str]] = {}

    def digest(self, obj: object) -> str:
        if obj is None:
            return "-"
        found = self._items.get(id(obj))
        if found is not None and found[0] is obj:
            return found[1]
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
        value = hashlib.sha256(text.encode()).hexdigest()[:16]
        if len(self._items) >= self._size:
            self._items.pop(next(iter(self._items)))
        self._items[id(obj)] = (obj, value)
        return value


_CACHE = _DigestCache()


def detail_revision(detail: JobDetail | None) -> str:
    """The provider's revision, or a digest of everything the page shows."""
    if detail is None:
        return "gone"
    if detail.revision is not None:
        return detail.revision
    small = {
        "summary": detail.summary.to_dict(),
        "ranks": {str(r): s.to_dict() for r, s in sorted(detail.ranks.items())},
    }
    parts = [
        _CACHE.digest(detail.report),
        _CACHE.digest(detail.timeline),
        hashlib.sha256(json.dumps(small, sort_keys=True).encode()).hexdigest()[:16],
    ]
    return hashlib.sha256(":".join(parts).encode()).hexdigest()[:20]
