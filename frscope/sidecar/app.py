"""The sidecar's composition root: polls every local rank's worker server, tracks progress, captures
evidence at a stall, watches the dump dir, and serves /metrics and the API of docs/sidecar-api.md.

The rooms, each with one job:
  ranks.py     which local ranks there are (sockets) and what is kept about each between polls
  recorder.py  one fr_trace_json answer -> a Digest (decoded in pieces, normalized, counted)
  poller.py    a poll round: probe-or-full decision, stall tracking, what the round found
  snapshot.py  which evidence of each rank is served; the snapshot body; the stall capture
  status.py    the /v1/status document
  auth.py      the bearer token
  http.py      the HTTP routes
  metrics.py   the Prometheus metrics
and frscope.wire spells every document that leaves the sidecar.

Everything runs on one asyncio loop; file I/O, JSON parsing, normalization and compression run in
worker threads (`asyncio.to_thread`), one parse at a time so that eight 2,000-entry recorders never
sit in memory decoded at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from frscope.sidecar.auth import (
    BearerToken,
    IssuerKeys,
    OperatorVerifier,
    accepted_audiences,
    default_api_server,
    push_token,
)
from frscope.sidecar.config import SidecarConfig
from frscope.sidecar.dumpdir import DumpDirWatcher, DumpFile
from frscope.sidecar.evidence import Capture, EvidenceStore
from frscope.sidecar.http import build_app
from frscope.sidecar.metrics import SidecarMetrics
from frscope.sidecar.poller import Poller
from frscope.sidecar.progress import GroupState, StallTracker
from frscope.sidecar.push import Pusher
from frscope.sidecar.ranks import RankState
from frscope.sidecar.schedule import next_slot, phase_s
from frscope.sidecar.snapshot import SnapshotAnswer, Snapshots
from frscope.sidecar.status import status_document
from frscope.sidecar.tls import FromFiles, OperatorIssued, ServingTls, operator_context
from frscope.sidecar.unrecorded import UnrecordedWatch
from frscope.wire import StatusDoc

log = logging.getLogger("frscope.sidecar")

# ?refresh=1 more often than this reuses the previous refresh.
MIN_REFRESH_INTERVAL_S = 1.0
# At shutdown (the pod ends once its trainer has, and its address goes with it), a last poll round of
# at most this long notices ranks that ended since the previous round and pushes them (`exit`).
FINAL_ROUND_S = 3.0


class Sidecar:
    def __init__(self, config: SidecarConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = SidecarMetrics(self.registry, config.metrics_detail)
        self.tracker = StallTracker(config.stall_after_s, config.stall_timeout_fraction,
                                    suspect_after_s=config.suspect_after_s, suspect_min_s=config.suspect_min_s)
        self.evidence = EvidenceStore(config.evidence_dir, max_files=config.evidence_max_files,
                                      max_bytes=config.evidence_max_bytes, memory=config.memory_captures)
        self.dumps = (
            DumpDirWatcher(config.dump_dir, settle_s=config.dump_settle_s, max_bytes=config.max_dump_bytes)
            if config.dump_dir is not None
            else None
        )
        verifier: OperatorVerifier | None = None
        if config.operator_identity:
            keys = IssuerKeys(config.api_server or default_api_server(), config.kube_token_dir)
            audiences = accepted_audiences(config.namespace, config.pod)
            verifier = OperatorVerifier(keys, config.operator_identity, audiences)
        self.auth = BearerToken(config.token_file, verifier)
        self.poller = Poller(config, self.tracker, self.metrics)
        self.unrecorded = UnrecordedWatch(config.suspect_min_s, config.suspect_after_s, config.stall_after_s,
                                          config.poll_interval_s)
        self.snapshots = Snapshots(config, self.poller, self.tracker, self.evidence, self.dumps, self.metrics)
        self.pusher: Pusher | None = None
        self.tls: ServingTls | None = None
        self.port: int | None = None
        self._poll_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._last_refresh: float = 0.0

    # -- what the rooms hold ------------------------------------------------------------------------

    @property
    def ranks(self) -> dict[int, RankState]:
        return self.poller.ranks

    @property
    def ready(self) -> bool:
        return self.poller.ready

    def rank_count(self) -> int:
        return len(self.poller.ranks)

    # -- lifecycle ----------------------------------------------------------------------------------

    def load_token(self) -> None:
        """Read the bearer token file (sync: at startup, before the loop serves). ValueError if unusable."""
        self.auth.load()

    def token(self) -> str | None:
        return self.auth.token()

    def _push_token(self) -> str | None:
        if self.auth.verifier is not None:
            return push_token(self.config.kube_token_dir)  # the pod's own, renewed by the kubelet
        return self.auth.token()

    async def start(self) -> None:
        if self.config.token_file is not None and not self.auth.loaded:
            await asyncio.to_thread(self.auth.load)
        on_disk = await asyncio.to_thread(self.evidence.scan)
        if on_disk:
            log.info("evidence: %d earlier capture(s) in %s", len(on_disk), self.config.evidence_dir)
        self.metrics.show_evidence(self.evidence)
        app = self.build_app()
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        to_operator = operator_context(self.config.operator_ca) if self.config.operator_ca else None
        if self.config.certificate_url:
            self.tls = OperatorIssued(self.config.certificate_url, self._push_token, operator_ca=to_operator)
        elif self.config.tls_cert_file is not None and self.config.tls_key_file is not None:
            self.tls = await asyncio.to_thread(FromFiles, self.config.tls_cert_file, self.config.tls_key_file)
        site = web.TCPSite(self._runner, self.config.host, self.config.port,
                           ssl_context=self.tls.context if self.tls is not None else None)
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self.config.port
        if self.config.operator_url:
            self.pusher = Pusher(
                self.config.operator_url, token=self._push_token, pod=self.config.pod, namespace=self.config.namespace,
                timeout_s=self.config.push_timeout_s, attempts=self.config.push_attempts,
                backoff_s=self.config.push_backoff_s, metrics=self.metrics, ssl_context=to_operator,
            )
            self._spawn(self.pusher.run(), "push")
        if self.tls is not None:
            self._spawn(self.tls.run(), "tls")
        if self.auth.verifier is not None:
            self._spawn(self.auth.verifier.keys.refresh(), "issuer-keys")  # ready before the operator's first call
        self._spawn(self._poll_loop(), "poll")
        if self.dumps is not None:
            self._spawn(self._dump_loop(), "dump-dir")
        if self.config.token_file is not None:
            self._spawn(self.auth.reload_loop(), "token")
        if self.config.port_file is not None:
            await asyncio.to_thread(_write_port_file, self.config.port_file, self.port)
        log.info(
            "frscope sidecar listening on %s:%d (%s); sockets %s, dump dir %s, evidence %s; poll every %g s, "
            "suspected after %g-%g s (by each group's rhythm), a stall after %g s",
            self.config.host, self.port, "https" if self.tls is not None else "http", self.config.socket_dir,
            self.config.dump_dir or "(none)",
            self.config.evidence_dir or "(memory only)", self.config.poll_interval_s, self.config.suspect_min_s,
            self.config.suspect_after_s, self.config.stall_after_s,
        )

    def build_app(self) -> web.Application:
        return build_app(self)

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the other loops or the server
                log.exception("sidecar task %s crashed", name)

        self._tasks.append(asyncio.create_task(guarded(), name=f"frscope-{name}"))

    async def stop(self) -> None:
        if self.pusher is not None:
            if any(task.get_name() == "frscope-poll" for task in self._tasks):
                try:
                    await asyncio.wait_for(self.poll_once(), FINAL_ROUND_S)
                except Exception:  # what was pushed before still goes out below
                    log.warning("the last poll round at shutdown did not finish", exc_info=True)
            await self.pusher.drain(min(5.0, self.config.push_timeout_s))
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.poller.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        log.info("frscope sidecar stopped")

    # -- loops --------------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        # The first round at once (find the ranks); then rounds on the wall clock's slots, the same
        # for every sidecar of the job (schedule.py says why).
        periodic: bool | None = None
        interval, every = self.config.poll_interval_s, self.config.full_poll_every
        phase = phase_s(self.config.schedule_key, interval, every)
        log.info("polls at %.3f s past every %g s of the wall clock, the full recorder every %d polls (schedule "
                 "key %r)", phase % interval, interval, every, self.config.schedule_key)
        while True:
            try:
                await self.poll_once(periodic=periodic)
            except Exception:
                log.exception("poll round failed")
            slot = next_slot(time.time(), interval, every, phase)
            await asyncio.sleep(slot.wait_s)
            periodic = slot.periodic

    async def _dump_loop(self) -> None:
        assert self.dumps is not None
        await asyncio.to_thread(self.dumps.prepare)
        while True:
            await self.scan_dumps()
            await asyncio.sleep(self.config.dump_scan_interval_s)

    # -- what a round leads to ----------------------------------------------------------------------

    async def poll_once(self, *, stacks: bool = False, full: bool = False,
                        periodic: bool | None = None) -> list[GroupState]:
        """One round over every local rank; returns the groups that became stalled. `full`: every
        rank's full recorder, whatever its progress probe says; `periodic`: the schedule's periodic
        full read (None: each rank's own count). A new stall is captured (every live rank's recorder
        and stacks) unless the current capture still holds; a trainer exit is pushed."""
        async with self._poll_lock:
            found = await self.poller.round(full, self._capture_wanted, periodic)
            if found.capture:
                await self.capture(found.capture)  # (takes every live rank's stacks too)
            elif stacks:
                await self.poller.fetch_stacks()
            await self._unrecorded_round()
            if found.exits and self.pusher is not None:
                self.pusher.submit("exit", await self.snapshots.render_gz("exit"))
            return found.newly

    async def _unrecorded_round(self) -> None:
        """A hang the recorder cannot see (unrecorded.py): suspected or confirmed, it is captured and
        pushed as a stall's suspicion is; its end retires that capture."""
        now_ns = self.poller.last_round_ns or time.time_ns()
        event = await self.unrecorded.round(self.poller, now_ns)
        self.metrics.show_unrecorded(self.unrecorded, self.ranks, now_ns)  # (with the state: no await between)
        if event in ("suspect", "stall"):
            if event == "stall":
                self.metrics.suspected_stalls.labels(outcome="confirmed").inc()
            if self._capture_wanted(event):
                await self.poller.refresh_recorders()
                await self.capture(event, unrecorded=True)
        elif event == "resumed":
            self.metrics.suspected_stalls.labels(outcome="resumed").inc()
        if event == "resumed" or (not self.unrecorded.suspected and self.snapshots.unrecorded_capture_held()):
            self.snapshots.retire_unrecorded()

    async def capture(self, reason: str, *, unrecorded: bool = False) -> Capture:
        """Stacks of every live rank, paired with this round's recorders; kept, and pushed.
        `unrecorded`: a hang the recorder cannot see (no group of it is in flight)."""
        with_stacks = await self.poller.fetch_stacks()
        capture = await self.snapshots.capture(reason, len(with_stacks), unrecorded=unrecorded)
        if self.pusher is not None:
            self.pusher.submit(reason, capture.body_gz)
        return capture

    def _capture_wanted(self, reason: str) -> bool:
        """A new capture for this episode: none holds yet, or a suspicion's capture holds and the stall
        is confirmed now (the confirmed stall is captured, and pushed, as before suspicions existed)."""
        current = self.current_capture()
        return current is None or (reason == "stall" and current.reason == "suspect")

    def current_capture(self) -> Capture | None:
        return self.snapshots.current_capture()

    async def scan_dumps(self) -> list[DumpFile]:
        if self.dumps is None:
            return []
        try:
            result = await asyncio.to_thread(self.dumps.scan)
        except Exception:
            log.exception("dump dir scan failed")
            return []
        for _item, kind in result.rejected:
            self.metrics.dump_files_rejected.labels(reason=kind.replace("-", "_")).inc()
        if result.parsed:
            self.metrics.dumps_collected.labels(kind="dump_file").inc(len(result.parsed))
            if self.pusher is not None:
                self.pusher.submit("dump", await self.snapshots.render_gz("dump"))
        return result.parsed

    # -- what the API serves ------------------------------------------------------------------------

    async def snapshot(self, reason: str, *, prefer_live: bool = False, last_entries: int | None = None,
                       gzip_asked: bool = True, if_none_match: str | None = None) -> SnapshotAnswer:
        return await self.snapshots.render(reason, prefer_live=prefer_live, last_entries=last_entries,
                                           gzip_asked=gzip_asked, if_none_match=if_none_match)

    async def refresh(self) -> None:
        """?refresh=1: poll every rank now, recorders and stacks (rate-limited)."""
        if time.monotonic() - self._last_refresh < MIN_REFRESH_INTERVAL_S:
            return
        await self.poll_once(stacks=True, full=True)
        self._last_refresh = time.monotonic()
        self.metrics.dumps_collected.labels(kind="refresh").inc(sum(1 for s in self.ranks.values() if s.up))

    def status(self) -> StatusDoc:
        return status_document(self.config, self.ranks, self.tracker, self.evidence, self.dumps,
                                self.poller.last_round_ns, time.time_ns(), self.poller.lateness, self.unrecorded)


def _write_port_file(path: Path, port: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(path)
