"""The live window of a job someone is looking at: the last N collectives of every rank, from its sidecars,
every `interval_s`, healthy or not, before any diagnosis.

Bounded whatever the sidecars answer (issue 34: one pod answering 1,024 ranks x 256 entries with the
page open took the operator from 188 to 2,108 MiB): each answer is streamed to a file (never whole in
the operator's memory) and decoded from it one rank at a time in the operator's decoder processes (its
`Decoder`, never threads of its own process), at most `ranks_per_pod` ranks of a pod's
answer are kept (`--live-ranks-per-pod`), and a job has at most one refresh in flight (a slow one is
not started again on top of itself).

A web UI request for a job (its page, data, event stream or trace) marks the job as watched; while it
was asked about within `linger_s`, each of its pods' sidecars is asked for `GET /v1/snapshot?entries=N`
(what the sidecar already holds: no extra poll of the ranks) every `interval_s`, the answers go through
the same loader as a diagnosis, and the timeline (frscope.report.timeline, each rank's own times
included) is built off the event loop. Jobs nobody looks at cost nothing.

Between refreshes a job keeps what it decoded (within MAX_KEPT_BYTES for every job together): a sidecar
serves what it read at its last full poll (every 30 s by default), the same ranks for many refreshes. Each
pod is asked with the ETag its sidecar gave for the answer kept (`gather`: If-None-Match, to that same
sidecar only), and its 304 keeps that answer: nothing fetched, inflated or decoded. From a sidecar that
gives no ETag, an answer that holds the same ranks and errors byte for byte is not decoded again. When no
pod's answer changed the window is the one made last time (no timeline, no perf): a refresh then costs
the 304s (bench/RESULTS.md, "Live window of 1,024 ranks: conditional requests").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from frscope.analysis.perf import analyze_perf
from frscope.operator.evidence.diagnosis import build_dumpset
from frscope.operator.evidence.gather import Decoder, Gathered, GatherOptions, Target, gather
from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.model.objects import JobKey
from frscope.operator.model.perf_metrics import PerfMetrics
from frscope.operator.model.store import JobsView
from frscope.records import DumpSet
from frscope.report.perf import perf_to_dict
from frscope.report.timeline import build_timeline

log = logging.getLogger(__name__)

DEFAULT_LIVE_ENTRIES = 256
DEFAULT_LIVE_INTERVAL_S = 1.0
DEFAULT_LIVE_LINGER_S = 60.0
MAX_WATCHED = 32  # jobs followed at once (the most recently asked about)
DEFAULT_LIVE_RANKS_PER_POD = 64  # a pod hosts a node's ranks: 8, rarely more than 64
# The decoded answers kept between refreshes, all jobs together, counted as the answers' decoded JSON size
# (what is kept, in columns, is about half of it): a 1,024-rank job's window of 256 entries is ~130 MiB
# of JSON. A job that would take the total past this keeps nothing and is decoded whole every refresh.
MAX_KEPT_BYTES = 512 * 1024 * 1024
# A pod whose answer was not decoded before a refresh's deadline keeps its last evidence for this many
# refreshes in a row, and the window its last drawing for this many intervals, while the others decode.
CARRY_REFRESHES = 10


@dataclass(frozen=True, slots=True)
class LiveWindow:
    at: float  # time.time() when the sidecars answered
    timeline: dict[str, Any] | None  # None: no rank had entries yet
    pods: int  # pods that answered
    failures: dict[str, str]  # pod -> why it did not
    fingerprint: str  # changes when what the page draws changes
    perf: dict[str, Any] | None = None  # where the time goes in the window (frscope.report.perf)


def _views(dumpset: DumpSet) -> tuple[dict[str, Any], dict[str, Any]]:
    return build_timeline(dumpset, None), perf_to_dict(analyze_perf(dumpset))


def _same(before: dict[str, PodEvidence], gathered: Gathered) -> bool:
    """Every pod's evidence is the one the last refresh had (`gather(previous=...)` kept it: same bytes)."""
    return bool(before) and before.keys() == gathered.pods.keys() and all(
        gathered.pods[pod] is evidence for pod, evidence in before.items())


def fingerprint(timeline: dict[str, Any] | None) -> str:
    """What changes when a rank records, starts or completes a collective: each group's newest seq and its
    cells' encoding (cheap: no hashing of the whole timeline)."""
    if timeline is None:
        return "-"
    parts = [(g["name"], g["seq_range"], g["col_cell"][-8:], len(g["patterns"]), g["row_pattern"][:64],
              sum(len(p) for p in g["patterns"])) for g in timeline["groups"]]
    text = json.dumps([parts, timeline.get("ranks_loaded")], separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class LiveWindows:
    def __init__(self, store: JobsView, client: SidecarClient, *, entries: int = DEFAULT_LIVE_ENTRIES,
                 interval_s: float = DEFAULT_LIVE_INTERVAL_S, linger_s: float = DEFAULT_LIVE_LINGER_S,
                 decoder: Decoder | None = None, metrics: PerfMetrics | None = None,
                 ranks_per_pod: int = DEFAULT_LIVE_RANKS_PER_POD) -> None:
        self.store = store
        self.metrics = metrics  # each kept window's --perf numbers as gauges
        self.client = client
        self.entries = entries
        self.interval_s = interval_s
        self.linger_s = linger_s
        self.decoder = decoder or Decoder()
        self.ranks_per_pod = ranks_per_pod
        self._in_flight: set[JobKey] = set()  # jobs whose refresh is under way: one at a time each
        self._spool: Path | None = None  # where answers are streamed (made on first use)
        self._asked: dict[JobKey, float] = {}  # job -> monotonic time it was last asked about
        self._windows: dict[JobKey, LiveWindow] = {}
        # What each job's last refresh decoded, by pod: an answer with the same bytes is not decoded again,
        # and a refresh where no pod's answer changed keeps the window it made (no timeline, no perf).
        self._decoded: dict[JobKey, dict[str, PodEvidence]] = {}
        self._carried: dict[JobKey, dict[str, int]] = {}  # pod -> refreshes in a row its evidence was carried
        self.rebuilt = 0  # windows made from changed answers (the others were kept)
        self._updated: dict[JobKey, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def watch(self, key: JobKey) -> None:
        """A request asked about this job: follow it (starts the loop on first use)."""
        if self._closed:
            return
        self._asked[key] = time.monotonic()
        if len(self._asked) > MAX_WATCHED:
            oldest = min(self._asked, key=self._asked.__getitem__)
            self._forget(oldest)
        if self._task is None or self._task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # asked outside the event loop (a test, a thread): the next request starts it
            self._task = loop.create_task(self.run())

    def window(self, key: JobKey) -> LiveWindow | None:
        return self._windows.get(key)

    async def wait_for(self, key: JobKey, timeout_s: float) -> LiveWindow | None:
        """The job's window, waiting up to `timeout_s` for the first one (a trace asked for at once)."""
        self.watch(key)
        if key not in self._windows:
            event = self._updated.setdefault(key, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
        return self._windows.get(key)

    async def refresh(self, key: JobKey) -> LiveWindow | None:
        """A new window of the job; while one is being made, the last one (never two at once)."""
        if key in self._in_flight:
            return self._windows.get(key)
        self._in_flight.add(key)
        try:
            return await self._refresh(key)
        finally:
            self._in_flight.discard(key)

    async def _refresh(self, key: JobKey) -> LiveWindow | None:
        view = self.store.job(key)
        if view is None:
            self._forget(key)
            return None
        targets = [Target(p.name, p.endpoint, None, p.uid) for p in view.pods]
        # A refresh has a fixed deadline (3 intervals): a pod not decoded by then keeps its last answer.
        options = GatherOptions(per_pod_timeout_s=max(1.0, self.interval_s * 2), overall_timeout_s=self.interval_s * 3,
                                limit_s=self.interval_s * 3, attempts=1, max_entries=self.entries, refresh=False,
                                max_ranks=self.ranks_per_pod, spool=self._spool_dir())
        before = self._decoded.get(key, {})
        gathered = await gather(self.client, key.namespace, targets, options, decoder=self.decoder,
                                previous=before)
        carried = self._carry(key, before, gathered)
        self._keep(key, gathered)
        last = self._windows.get(key)
        if last is not None and gathered.failures == last.failures and (
                _same(before, gathered) or carried and time.time() - last.at < CARRY_REFRESHES * self.interval_s):
            # Every sidecar answered what it answered last time (it serves its last full poll, for many
            # refreshes), or some answers (a full poll of every pod) could not all be decoded before the
            # deadline: the window stays the one it was until they are, drawn once from all of them.
            window = replace(last, at=time.time()) if not carried else last
        else:
            dumpset = build_dumpset(gathered, view.world_size)
            timeline, perf = await asyncio.to_thread(_views, dumpset) if dumpset.dumps else (None, None)
            window = LiveWindow(time.time(), timeline, len(gathered.pods), dict(gathered.failures),
                                fingerprint(timeline), perf)
            self.rebuilt += 1
        self._windows[key] = window
        if self.metrics is not None and key in self._asked:
            self.metrics.update(key.namespace, key.name, window.perf)
        event = self._updated.pop(key, None)
        if event is not None:
            event.set()
        return window

    def _carry(self, key: JobKey, before: dict[str, PodEvidence], gathered: Gathered) -> bool:
        """A pod not decoded this time (the refresh's deadline: every pod's full poll landed at once on a
        busy operator) that was decoded before keeps its last evidence, for CARRY_REFRESHES refreshes in a
        row at most (a sidecar that stays away is then a failure); True if any did."""
        counts = self._carried.setdefault(key, {})
        failed = set(gathered.failures)
        for pod in list(counts):
            if pod not in failed:
                del counts[pod]  # it answered
        carried = False
        for pod in failed:
            if pod in before and counts.get(pod, 0) < CARRY_REFRESHES:
                counts[pod] = counts.get(pod, 0) + 1
                gathered.pods[pod] = before[pod]
                del gathered.failures[pod]
                carried = True
        return carried

    def _keep(self, key: JobKey, gathered: Gathered) -> None:
        """Keep what this refresh decoded for the next one, within MAX_KEPT_BYTES for every job together."""
        self._decoded.pop(key, None)
        size = sum(e.size_bytes for e in gathered.pods.values())
        others = sum(e.size_bytes for pods in self._decoded.values() for e in pods.values())
        if others + size <= MAX_KEPT_BYTES:
            self._decoded[key] = dict(gathered.pods)

    def _spool_dir(self) -> Path:
        if self._spool is None:
            self._spool = Path(tempfile.mkdtemp(prefix="frscope-live-"))
        return self._spool

    def _forget(self, key: JobKey) -> None:
        self._asked.pop(key, None)
        self._windows.pop(key, None)
        self._decoded.pop(key, None)
        self._carried.pop(key, None)
        if self.metrics is not None:
            self.metrics.remove(key.namespace, key.name)

    async def _refresh_logged(self, key: JobKey) -> None:
        try:
            await self.refresh(key)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("live window of %s failed", key)

    async def run(self) -> None:
        while not self._closed:
            started = time.monotonic()
            for key, asked in list(self._asked.items()):
                if started - asked > self.linger_s:
                    self._forget(key)
            await asyncio.gather(*(self._refresh_logged(key) for key in list(self._asked)))
            if not self._asked:
                return
            # a refresh that took longer than the interval (a 1,024-rank job on a busy operator) waits as
            # long again: the live windows never take more than about half of the operator's time
            took = time.monotonic() - started
            await asyncio.sleep(max(0.1, self.interval_s - took, took if took > self.interval_s else 0.0))

    async def close(self, *_: Any) -> None:
        self._closed = True
        for key in list(self._asked):
            self._forget(key)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._spool is not None:  # answers are removed once decoded; the folder itself goes here
            await asyncio.to_thread(shutil.rmtree, self._spool, True)
            self._spool = None
