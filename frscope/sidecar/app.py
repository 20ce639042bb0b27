"""The sidecar: polls every local rank's worker server, tracks progress, captures evidence at a stall,
watches the dump dir, and serves /metrics and the API of docs/sidecar-api.md.

Everything runs on one asyncio loop; file I/O, JSON parsing, normalization and compression run in
worker threads (`asyncio.to_thread`), one parse at a time so that eight 2,000-entry recorders never
sit in memory decoded at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hmac
import json
import logging
import os
import re
import stat
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from frscope.analysis import op_label
from frscope.records import DumpError, normalize_dump
from frscope.sidecar.auth import IssuerKeys, OperatorVerifier, TokenRejected, default_api_server, push_token
from frscope.sidecar.client import PROGRESS_PROBES, Fingerprint, WorkerClient, WorkerError
from frscope.sidecar.config import SidecarConfig
from frscope.sidecar.dumpdir import DumpDirWatcher, DumpFile, snapshot_piece
from frscope.sidecar.evidence import Capture, EvidenceStore
from frscope.sidecar.metrics import SidecarMetrics
from frscope.sidecar.progress import GroupSample, GroupState, StallTracker, sample_groups, without_inflight
from frscope.sidecar.push import Pusher

log = logging.getLogger("frscope.sidecar")

STATUS_SCHEMA = "frscope.sidecar.status/v1"
SNAPSHOT_SCHEMA = "frscope.sidecar.snapshot/v1"
_SOCKET = re.compile(r"^rank-(\d+)\.sock$")
PROBES = frozenset({"/healthz", "/readyz"})
TOKEN_RELOAD_S = 30.0
# ?refresh=1 more often than this reuses the previous refresh.
MIN_REFRESH_INTERVAL_S = 1.0
# Trainer exits are these reasons (the socket refuses or is gone); a timeout is a wedged rank.
EXIT_REASONS = frozenset({"connect", "no_socket"})


@dataclass(slots=True)
class RankState:
    rank: int
    socket_path: Path
    client: WorkerClient
    up: bool = False
    ever_up: bool = False
    error: str | None = None
    reason: str | None = None
    last_poll_ns: int | None = None
    last_ok_ns: int | None = None
    raw_ns: int | None = None  # when the kept full recorder (raw_z) was fetched
    raw_hash: bytes | None = None
    raw_z: bytes | None = None  # zlib of the last good fr_trace_json answer
    stacks: str | None = None
    stacks_for_ns: int | None = None  # the last_ok_ns the stacks belong to
    count_watermark: int = -1
    duration_watermark: int = -1
    samples: dict[str, GroupSample] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    # The cheap progress probe (client.PROGRESS_PROBES): which one the rank answers ("" none: full polls only;
    # None: not asked yet since the rank (re)appeared), and what it showed.
    probe: tuple[str, str] | None = None
    probe_fp: Fingerprint | None = None
    probe_ns: int | None = None  # the latest probe
    probe_first_ns: int | None = None  # the first probe that showed probe_fp
    probe_before_ns: int | None = None  # the probe before that one (a change happened after it)
    full_fp: Fingerprint | None = None  # probe_fp when the kept full recorder was fetched
    polls_since_full: int = 0


@dataclass(slots=True)
class Digest:
    """What one poll of one rank yields, computed in a worker thread."""

    raw_hash: bytes
    raw_z: bytes | None  # None: unchanged since the last poll
    samples: dict[str, GroupSample] | None
    new_ops: list[tuple[str, str]]
    durations: list[tuple[str, float]]
    count_watermark: int
    duration_watermark: int
    info: dict[str, str]


_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def loads_in_pieces(raw: bytes) -> Any:
    """json.loads for a top-level object whose big values are lists (`entries`), decoding each list
    element on its own. json.loads is one C call that holds the GIL for the whole document (tens of ms
    for a 2,000-entry recorder); between elements the event loop's thread gets the GIL back, so
    /metrics answers while a recorder is parsed. Same result as json.loads; ValueError if invalid."""
    text = raw.decode("utf-8")
    ws, decode = _WS.match, _DECODER.raw_decode

    def skip(i: int) -> int:
        m = ws(text, i)
        return m.end() if m else i

    def expect(i: int, char: str) -> int:
        if text[i:i + 1] != char:
            raise ValueError(f"expected {char!r} at byte {i}")
        return i + 1

    i = expect(skip(0), "{")
    out: dict[str, Any] = {}
    i = skip(i)
    if text[i:i + 1] == "}":
        i += 1
    else:
        while True:
            key, i = decode(text, i)
            if not isinstance(key, str):
                raise ValueError(f"object key at byte {i} is not a string")
            i = skip(expect(skip(i), ":"))
            if text[i:i + 1] == "[":
                items: list[Any] = []
                i = skip(i + 1)
                if text[i:i + 1] == "]":
                    i += 1
                else:
                    while True:
                        item, i = decode(text, i)
                        items.append(item)
                        i = skip(i)
                        if text[i:i + 1] == ",":
                            i = skip(i + 1)
                            continue
                        i = expect(i, "]")
                        break
                value: Any = items
            else:
                value, i = decode(text, i)
            out[key] = value
            i = skip(i)
            if text[i:i + 1] == ",":
                i = skip(i + 1)
                continue
            i = expect(i, "}")
            break
    if skip(i) != len(text):
        raise ValueError(f"extra data at byte {skip(i)}")
    return out


def _digest(raw_z: bytes, raw_hash: bytes, rank: int, source: str, previous: RankState) -> Digest:
    """Parse and normalize one fr_trace_json answer, given compressed (worker thread). Raises WorkerError."""
    if raw_hash == previous.raw_hash:
        return Digest(raw_hash, None, None, [], [], previous.count_watermark, previous.duration_watermark,
                      previous.info)
    raw = zlib.decompress(raw_z)
    try:
        obj = loads_in_pieces(raw) if raw.lstrip()[:1] == b"{" else json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise WorkerError("decode", f"{source}: fr_trace_json: not JSON: {exc}") from exc
    try:
        dump = normalize_dump(obj, source, rank)
    except DumpError as exc:
        raise WorkerError("malformed", f"{source}: fr_trace_json: {exc.message}") from exc
    del obj
    dump.rank = rank  # the socket name is the truth for a live rank
    samples = sample_groups(dump)
    entries = dump.entries
    top = max((e.record_id for e in entries), default=-1)
    count_wm = previous.count_watermark
    duration_wm = previous.duration_watermark
    if top < count_wm:  # a new process behind the same socket: record ids start again
        count_wm = duration_wm = -1
    new_ops: list[tuple[str, str]] = []
    durations: list[tuple[str, float]] = []
    advancing = True
    for entry in entries:
        rid = entry.record_id
        if rid > count_wm:
            new_ops.append((entry.pg_name, op_label(entry.op)))
        if advancing and rid > duration_wm:
            if entry.completed or entry.duration_ms is not None:
                if entry.duration_ms is not None:
                    durations.append((op_label(entry.op), entry.duration_ms / 1000.0))
                duration_wm = rid
            else:
                advancing = False
    info = {
        "backend": dump.backend or "unknown",
        "recorder_version": dump.version or "unknown",
        "comm_lib_version": dump.comm_lib_version or "unknown",
        "torch_version": str(previous.meta.get("torch_version") or "unknown"),
    }
    return Digest(raw_hash, raw_z, samples, new_ops, durations, max(count_wm, top), duration_wm, info)


def _scan_sockets(socket_dir: Path) -> dict[int, Path] | None:
    """rank -> socket path for every rank-<r>.sock that is a socket; None if the dir is missing."""
    found: dict[int, Path] = {}
    try:
        with os.scandir(socket_dir) as it:
            for item in it:
                match = _SOCKET.match(item.name)
                if not match:
                    continue
                try:
                    if stat.S_ISSOCK(item.stat(follow_symlinks=True).st_mode):
                        found[int(match.group(1))] = Path(item.path)
                except OSError:
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return None
    return found


def _read_meta(socket_dir: Path, rank: int) -> dict[str, Any]:
    """What the bootstrap wrote about the rank (torch version, pid), if anything."""
    path = socket_dir / f".rank-{rank}.json"
    try:
        data = json.loads(path.read_bytes()[:65536])
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _live_piece(state: RankState) -> bytes | None:
    if state.raw_z is None or state.raw_ns is None:
        return None
    stacks = state.stacks if state.stacks_for_ns == state.raw_ns else None
    piece = snapshot_piece(state.rank, state.raw_ns, f"socket:{state.socket_path}", stacks,
                           zlib.decompress(state.raw_z))
    return zlib.compress(piece, 1)


def _newest_entries(piece_z: bytes, last: int) -> bytes:
    """`?entries=N`: keep each rank's newest N recorder entries (a hang is decided by the newest ones;
    the operator keeps no more than that, so sending the whole ring is wasted work at 1,024 ranks)."""
    piece = zlib.decompress(piece_z)
    try:
        obj = json.loads(piece)
    except ValueError:
        return piece_z
    trace = obj.get("trace") if isinstance(obj, dict) else None
    if not isinstance(trace, dict):
        return piece_z
    entries = trace.get("entries")
    if not isinstance(entries, list) or len(entries) <= last:
        return piece_z
    trace["entries"] = entries[-last:]
    obj["entries_dropped"] = len(entries) - last
    return zlib.compress(json.dumps(obj, separators=(",", ":")).encode(), 1)


def _assemble(head: dict[str, Any], pieces: list[tuple[int, bytes]], errors: list[dict[str, Any]],
              max_bytes: int) -> tuple[bytes, bytes]:
    """The snapshot body (docs/sidecar-api.md) and its gzip, within `max_bytes` (worker thread)."""
    parts: list[bytes] = []
    used = 512 + len(json.dumps(errors))
    for rank, piece_z in pieces:
        piece = zlib.decompress(piece_z)
        if used + len(piece) + 1 > max_bytes:
            error = {"rank": rank, "message": f"left out: the snapshot would exceed --max-snapshot-bytes "
                                              f"({max_bytes} bytes); rank's piece is {len(piece)} bytes"}
            errors.append(error)
            used += len(json.dumps(error)) + 2
            continue
        used += len(piece) + 1
        parts.append(piece)
    body = (
        json.dumps(head)[:-1].encode()
        + b', "ranks": [' + b",".join(parts) + b'], "errors": ' + json.dumps(errors).encode() + b"}"
    )
    return body, gzip.compress(body, 6)


class Sidecar:
    def __init__(self, config: SidecarConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = SidecarMetrics(self.registry)
        self.tracker = StallTracker(config.stall_after_s, config.stall_timeout_fraction)
        self.ranks: dict[int, RankState] = {}
        self.evidence = EvidenceStore(config.evidence_dir, max_files=config.evidence_max_files,
                                      max_bytes=config.evidence_max_bytes, memory=config.memory_captures)
        self.dumps = (
            DumpDirWatcher(config.dump_dir, settle_s=config.dump_settle_s, max_bytes=config.max_dump_bytes)
            if config.dump_dir is not None
            else None
        )
        self.ready = False
        self.polls_done = 0
        self.last_round_ns: int | None = None
        self.stale_captures: set[int] = set()  # captured_at_ns of captures no longer current
        self.pusher: Pusher | None = None
        self.port: int | None = None
        self._token: str | None = None
        self._token_mtime: int | None = None
        self.verifier: OperatorVerifier | None = None
        if config.operator_identity:
            keys = IssuerKeys(config.api_server or default_api_server(), config.kube_token_dir)
            self.verifier = OperatorVerifier(keys, config.operator_identity)
        self._socket_dir_missing_logged = False
        self._poll_lock = asyncio.Lock()
        self._parse_slot = asyncio.Semaphore(1)
        self._fetch_slots = asyncio.Semaphore(max(1, config.max_concurrency))
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._last_refresh: float = 0.0
        self._stopping = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------------------

    def load_token(self) -> None:
        """Read the bearer token file (sync: at startup, before the loop serves). ValueError if unusable."""
        path = self.config.token_file
        if path is None:
            return
        try:
            token = path.read_text().strip()
            self._token_mtime = path.stat().st_mtime_ns
        except OSError as exc:
            raise ValueError(f"--token-file {path}: {exc.strerror or exc}") from exc
        if not token:
            raise ValueError(f"--token-file {path} is empty")
        self._token = token

    def token(self) -> str | None:
        return self._token

    def _push_token(self) -> str | None:
        if self.verifier is not None:
            return push_token(self.config.kube_token_dir)  # the pod's own, renewed by the kubelet
        return self._token

    async def start(self) -> None:
        if self.config.token_file is not None and self._token is None:
            await asyncio.to_thread(self.load_token)
        on_disk = await asyncio.to_thread(self.evidence.scan)
        if on_disk:
            log.info("evidence: %d earlier capture(s) in %s", len(on_disk), self.config.evidence_dir)
        self._update_evidence_metrics()
        app = self.build_app()
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self.config.port
        if self.config.operator_url:
            self.pusher = Pusher(
                self.config.operator_url, token=self._push_token, pod=self.config.pod, namespace=self.config.namespace,
                timeout_s=self.config.push_timeout_s, attempts=self.config.push_attempts,
                backoff_s=self.config.push_backoff_s, metrics=self.metrics,
            )
            self._spawn(self.pusher.run(), "push")
        if self.verifier is not None:
            self._spawn(self.verifier.keys.refresh(), "issuer-keys")  # ready before the operator's first call
        self._spawn(self._poll_loop(), "poll")
        if self.dumps is not None:
            self._spawn(self._dump_loop(), "dump-dir")
        if self.config.token_file is not None:
            self._spawn(self._token_loop(), "token")
        if self.config.port_file is not None:
            await asyncio.to_thread(_write_port_file, self.config.port_file, self.port)
        log.info(
            "frscope sidecar listening on %s:%d; sockets %s, dump dir %s, evidence %s; poll every %g s, "
            "stall after %g s",
            self.config.host, self.port, self.config.socket_dir, self.config.dump_dir or "(none)",
            self.config.evidence_dir or "(memory only)", self.config.poll_interval_s, self.config.stall_after_s,
        )

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
        self._stopping.set()
        if self.pusher is not None:
            await self.pusher.drain(min(5.0, self.config.push_timeout_s))
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for state in self.ranks.values():
            await state.client.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        log.info("frscope sidecar stopped")

    # -- loops --------------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        interval = self.config.poll_interval_s
        while True:
            started = time.monotonic()
            try:
                await self.poll_once()
            except Exception:
                log.exception("poll round failed")
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, interval - elapsed) if elapsed < interval else min(interval, 1.0))

    async def _dump_loop(self) -> None:
        assert self.dumps is not None
        await asyncio.to_thread(self.dumps.prepare)
        while True:
            await self.scan_dumps()
            await asyncio.sleep(self.config.dump_scan_interval_s)

    async def _token_loop(self) -> None:
        path = self.config.token_file
        assert path is not None
        while True:
            await asyncio.sleep(TOKEN_RELOAD_S)
            try:
                mtime = (await asyncio.to_thread(path.stat)).st_mtime_ns
                if mtime != self._token_mtime:
                    token = (await asyncio.to_thread(path.read_text)).strip()
                    if token:
                        self._token, self._token_mtime = token, mtime
                        log.info("token file %s reloaded", path)
            except OSError as exc:
                log.warning("token file %s cannot be read (%s); keeping the previous token", path,
                            exc.strerror or exc)

    # -- polling ------------------------------------------------------------------------------------

    async def poll_once(self, *, stacks: bool = False, full: bool = False) -> list[GroupState]:
        """One round over every local rank; returns the groups that became stalled. `full`: every
        rank's full recorder, whatever its progress probe says."""
        async with self._poll_lock:
            return await self._poll_round(stacks, full)

    async def _poll_round(self, want_stacks: bool, want_full: bool = False) -> list[GroupState]:
        t0 = time.perf_counter()
        now_ns = time.time_ns()
        previous_round = self.last_round_ns
        found = await asyncio.to_thread(_scan_sockets, self.config.socket_dir)
        if found is None:
            if not self._socket_dir_missing_logged:
                log.warning("socket dir %s does not exist (yet); no rank to poll", self.config.socket_dir)
                self._socket_dir_missing_logged = True
            found = {}
        elif self._socket_dir_missing_logged:
            log.info("socket dir %s is there now", self.config.socket_dir)
            self._socket_dir_missing_logged = False
        for rank, path in found.items():
            if rank not in self.ranks:
                self.ranks[rank] = RankState(
                    rank, path,
                    WorkerClient(path, timeout_s=self.config.request_timeout_s, max_bytes=self.config.max_answer_bytes),
                )
                self.metrics.worker_up.labels(rank=str(rank)).set(0)
                log.info("rank %d: socket %s found", rank, path)
        went_down: list[int] = []
        for rank, state in self.ranks.items():
            if rank not in found:
                if self._mark_down(state, WorkerError("no_socket", f"socket {state.socket_path} is gone"), now_ns):
                    went_down.append(rank)
        results = await asyncio.gather(
            *(self._poll_rank(self.ranks[rank], now_ns, previous_round, want_full) for rank in sorted(found))
        )
        newly: list[GroupState] = []
        for rank, (stalled, down) in zip(sorted(found), results, strict=True):
            newly.extend(stalled)
            if down:
                went_down.append(rank)
        capture = bool(newly) and self.current_capture() is None
        if capture:
            # Every live rank's full recorder of this moment (a rank that only answered its probe
            # this round is fetched now); _capture then takes every rank's stacks.
            behind = [s for s in self.ranks.values() if s.up and s.raw_ns != now_ns]
            more = await asyncio.gather(
                *(self._fetch_full(s, now_ns, previous_round, "stall_capture") for s in behind)
            )
            seen = {(g.rank, g.sample.pg) for g in newly}
            for state, (extra, down) in zip(behind, more, strict=True):
                newly.extend(g for g in extra if (g.rank, g.sample.pg) not in seen)
                if down:
                    went_down.append(state.rank)
        self.last_round_ns = now_ns
        self._update_progress_metrics(now_ns)
        self.polls_done += 1
        self.metrics.polls.inc()
        self.metrics.poll_duration.observe(time.perf_counter() - t0)
        if not self.ready:
            self.ready = True
            log.info("first poll done: %d rank socket(s)", len(found))
        for group in newly:
            self.metrics.stalls.labels(rank=str(group.rank), pg=group.sample.pg).inc()
            age = group.inflight_age_s(now_ns)
            log.warning(
                "stall: rank %d, group %s%s: %s #%s in flight%s, no progress for %.1f s (threshold %.1f s)",
                group.rank, group.sample.pg, f" ({group.sample.desc})" if group.sample.desc else "",
                group.sample.inflight_op, group.sample.inflight_seq,
                f" for {age:.1f} s" if age is not None else "", (now_ns - group.progress_ns) / 1e9, group.threshold_s,
            )
        if capture:
            await self._capture("stall")  # (takes every live rank's stacks too)
        elif want_stacks:
            await self._fetch_stacks()
        exits = [r for r in went_down if self.ranks[r].reason in EXIT_REASONS and self.ranks[r].ever_up]
        if exits and self.pusher is not None:
            body = await self._snapshot_gz("exit")
            self.pusher.submit("exit", body)
        return newly

    async def _poll_rank(
        self, state: RankState, now_ns: int, previous_round: int | None, force_full: bool = False
    ) -> tuple[list[GroupState], bool]:
        """Probe the rank's progress; fetch its full recorder only when needed (docs/sidecar.md, "What
        a poll costs"): no recorder kept yet or the rank (re)appeared, every --full-poll-every polls,
        ?refresh=1, no probe available, or the probe suggests a stall (a collective in flight and no
        change since the previous poll) that the kept recorder does not show yet."""
        state.last_poll_ns = now_ns
        probed = False
        moved = False
        inflight = False
        cause = None
        try:
            if state.probe is None or not state.up:
                state.probe = await self._find_probe(state)
                state.probe_fp = state.full_fp = None
            if state.probe[0]:
                async with self._fetch_slots:
                    fp, inflight = await state.client.probe(*state.probe)
                probed = True
                if fp != state.probe_fp:
                    moved = state.probe_fp is not None
                    state.probe_before_ns = state.probe_ns
                    state.probe_first_ns = now_ns
                    state.probe_fp = fp
                state.probe_ns = now_ns
        except WorkerError as exc:
            return [], self._mark_down(state, exc, now_ns)
        stalled_here = any(g.stalled for g in self.tracker.for_rank(state.rank).values())
        if force_full:
            cause = "refresh"
        elif not state.up or state.raw_z is None:
            cause = "first"
        elif not probed:
            cause = "no_probe"
        elif state.polls_since_full + 1 >= self.config.full_poll_every:
            cause = "periodic"
        elif moved and stalled_here:
            cause = "resumed"
        elif inflight and not moved and state.probe_fp != state.full_fp:
            cause = "suspect"
        if cause is not None:
            return await self._fetch_full(state, now_ns, previous_round, cause)
        # The probe is enough: the kept recorder's samples, with what the probe adds.
        state.polls_since_full += 1
        self._mark_up(state, now_ns)
        samples = state.samples
        if moved or not inflight:
            samples = without_inflight(samples)
        return self.tracker.update(state.rank, samples, now_ns, previous_round, moved=moved), False

    async def _find_probe(self, state: RankState) -> tuple[str, str]:
        """The first probe of client.PROGRESS_PROBES the rank answers with a pg_status; ("", "") if none.
        A rank that cannot be reached at all raises WorkerError."""
        if self.config.full_poll_every <= 1:
            return ("", "")
        before = state.probe
        for handler, query in PROGRESS_PROBES:
            try:
                async with self._fetch_slots:
                    fp, _inflight = await state.client.probe(handler, query)
            except WorkerError as exc:
                if exc.reason in ("http", "decode"):
                    continue
                raise
            if fp or handler == "frscope_progress":
                if before != (handler, query):
                    log.info("rank %d: progress probe %s; full recorder every %d polls or on a suspected stall",
                             state.rank, handler, self.config.full_poll_every)
                return (handler, query)
        if before != ("", ""):
            log.info("rank %d: no progress probe; the full recorder is fetched at every poll", state.rank)
        return ("", "")

    def _mark_up(self, state: RankState, now_ns: int) -> None:
        if not state.up:
            log.info("rank %d: worker server at %s answers%s", state.rank, state.socket_path,
                     " again" if state.ever_up else "")
        state.up, state.ever_up, state.error, state.reason = True, True, None, None
        state.last_ok_ns = now_ns
        self.metrics.worker_up.labels(rank=str(state.rank)).set(1)

    async def _fetch_full(self, state: RankState, now_ns: int, previous_round: int | None,
                          cause: str) -> tuple[list[GroupState], bool]:
        """fr_trace_json: parse, count, track: (groups that became stalled, whether the rank went down
        at this fetch)."""
        source = f"socket:{state.socket_path}"
        try:
            async with self._fetch_slots:
                raw_z, raw_hash, _size = await state.client.fr_trace_json()
            if not state.up:  # (again) answering: perhaps a new process, re-read what the bootstrap wrote
                state.meta = await asyncio.to_thread(_read_meta, self.config.socket_dir, state.rank)
            async with self._parse_slot:
                digest = await asyncio.to_thread(_digest, raw_z, raw_hash, state.rank, source, state)
        except WorkerError as exc:
            return [], self._mark_down(state, exc, now_ns)
        self.metrics.recorder_fetches.labels(cause=cause).inc()
        rank_label = str(state.rank)
        self._mark_up(state, now_ns)
        state.raw_ns = now_ns
        state.full_fp = state.probe_fp
        state.polls_since_full = 0
        if digest.raw_z is not None:
            state.raw_z = digest.raw_z
            state.raw_hash = digest.raw_hash
        state.count_watermark, state.duration_watermark = digest.count_watermark, digest.duration_watermark
        for pg, op in digest.new_ops:
            self.metrics.collectives.labels(rank=rank_label, pg=pg, op=op).inc()
        for op, seconds in digest.durations:
            self.metrics.duration.labels(op=op).observe(seconds)
        if digest.info != state.info:
            state.info = digest.info
            self.metrics.recorder_info.labels(rank=rank_label).info(digest.info)
        samples = digest.samples if digest.samples is not None else state.samples
        state.samples = samples
        if state.probe_fp is not None and state.probe_first_ns is not None:
            # A change the recorder cannot date happened after the probe before the current
            # progress was first seen, and by the probe that first saw it.
            return self.tracker.update(state.rank, samples, now_ns, state.probe_before_ns,
                                       changed_by_ns=state.probe_first_ns), False
        return self.tracker.update(state.rank, samples, now_ns, previous_round), False

    def _mark_down(self, state: RankState, exc: WorkerError, now_ns: int) -> bool:
        """Record a failed poll; True when the rank was up until now."""
        self.metrics.poll_errors.labels(rank=str(state.rank), reason=exc.reason).inc()
        self.metrics.worker_up.labels(rank=str(state.rank)).set(0)
        was_up = state.up
        if was_up or state.reason != exc.reason:
            kept = ""
            if state.last_ok_ns is not None:
                kept = f"; its last good recorder ({(now_ns - state.last_ok_ns) / 1e9:.1f} s old) is kept"
            log.warning("rank %d: %s%s", state.rank, exc.message, kept)
        state.up, state.error, state.reason = False, exc.message, exc.reason
        return was_up

    async def _fetch_stacks(self) -> list[int]:
        """dump_traceback from every rank that answered the last round; the ranks that gave one."""
        ranks = [s for s in self.ranks.values() if s.up and s.raw_ns is not None]

        async def one(state: RankState) -> bool:
            try:
                async with self._fetch_slots:
                    text = await state.client.dump_traceback(self.config.stacks_timeout_s,
                                                             self.config.max_stacks_bytes)
            except WorkerError as exc:
                self.metrics.poll_errors.labels(rank=str(state.rank), reason=exc.reason).inc()
                log.warning("rank %d: no stacks: %s", state.rank, exc.message)
                return False
            state.stacks, state.stacks_for_ns = text, state.raw_ns
            return True

        got = await asyncio.gather(*(one(s) for s in ranks))
        return [s.rank for s, ok in zip(ranks, got, strict=True) if ok]

    async def _capture(self, reason: str) -> Capture:
        """Stacks of every live rank, paired with this round's recorders; kept in memory and on disk."""
        with_stacks = await self._fetch_stacks()
        now_ns = self.last_round_ns or time.time_ns()
        states = [s for s in self.ranks.values() if s.raw_z is not None]

        def build() -> dict[int, bytes]:
            out: dict[int, bytes] = {}
            for state in states:
                piece = _live_piece(state)
                if piece is not None:
                    out[state.rank] = piece
            return out

        pieces = await asyncio.to_thread(build)
        errors = [{"rank": s.rank, "message": s.error} for s in self.ranks.values() if not s.up and s.error]
        head = self._head(reason, now_ns)
        _body, body_gz = await asyncio.to_thread(
            _assemble, head, sorted(pieces.items()), errors, self.config.max_snapshot_bytes
        )
        stalled = {
            (g.rank, g.sample.pg): g.sample.last_enqueued_seq or 0 for g in self.tracker.stalled
        }
        capture = Capture(reason, now_ns, pieces, body_gz, stalled)
        written = await asyncio.to_thread(self.evidence.write, capture)
        if not written:
            self.metrics.evidence_write_errors.inc()
        self._update_evidence_metrics()
        self.metrics.dumps_collected.labels(kind="stall_capture").inc(len(pieces))
        log.warning(
            "captured recorders of %d rank(s) and stacks of %d at the %s (%d bytes compressed)%s",
            len(pieces), len(with_stacks), reason, len(body_gz),
            f"; kept in {capture.path}" if capture.path else "; kept in memory",
        )
        if self.pusher is not None:
            self.pusher.submit(reason, body_gz)
        return capture

    def current_capture(self) -> Capture | None:
        """The newest stall capture while it is still the truth: none of the groups stalled at capture
        time has enqueued a collective since (gloo retires a failed collective, which looks like
        progress; a new enqueue does not happen after a failure)."""
        capture = self.evidence.latest()
        if capture is None or capture.captured_at_ns in self.stale_captures:
            return None
        for (rank, pg), seq in capture.stalled_groups.items():
            state = self.tracker.groups.get((rank, pg))
            if state is not None and (state.sample.last_enqueued_seq or 0) != seq:
                self.stale_captures.add(capture.captured_at_ns)
                return None
        return capture

    # -- dump dir -----------------------------------------------------------------------------------

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
                self.pusher.submit("dump", await self._snapshot_gz("dump"))
        return result.parsed

    # -- snapshot -----------------------------------------------------------------------------------

    def _head(self, reason: str, now_ns: int) -> dict[str, Any]:
        return {
            "schema": SNAPSHOT_SCHEMA,
            "pod": self.config.pod,
            "namespace": self.config.namespace,
            "node": self.config.node,
            "captured_at_ns": now_ns,
            "reason": reason,
        }

    def _choose(self, prefer_live: bool) -> tuple[list[tuple[int, bytes | RankState]], list[dict[str, Any]], bool]:
        """Per rank, the best evidence: a dump file newer than anything else; else the current stall
        capture; else the last good poll. Returns (pieces or states to render, errors, from_capture)."""
        capture = None if prefer_live else self.current_capture()
        by_rank = self.dumps.by_rank() if self.dumps is not None else {}
        chosen: list[tuple[int, bytes | RankState]] = []
        errors: list[dict[str, Any]] = []
        used_capture = False
        for rank in sorted(set(self.ranks) | set(by_rank) | (set(capture.pieces) if capture else set())):
            state = self.ranks.get(rank)
            dump = by_rank.get(rank)
            in_capture = capture is not None and rank in capture.pieces
            live_ns = state.raw_ns if state is not None and state.raw_z is not None else None
            best_other_ns = capture.captured_at_ns if in_capture and capture else live_ns
            if dump is not None and dump.piece is not None and (best_other_ns is None or dump.mtime_ns > best_other_ns):
                chosen.append((rank, dump.piece))
            elif in_capture and capture is not None:
                chosen.append((rank, capture.pieces[rank]))
                used_capture = True
            elif state is not None and state.raw_z is not None:
                chosen.append((rank, state))
            if state is not None and not state.up and state.error:
                errors.append({"rank": rank, "message": state.error})
        if self.dumps is not None:
            for item in self.dumps.files.values():
                if item.state == "rejected":
                    errors.append({"rank": item.rank, "message": f"{item.path}: {item.error}"})
        return chosen, errors, used_capture

    async def _snapshot(
        self, reason: str, *, prefer_live: bool = False, last_entries: int | None = None
    ) -> tuple[bytes, bytes, str]:
        chosen, errors, used_capture = self._choose(prefer_live)
        if used_capture and reason == "poll":
            reason = "stall"
        head = self._head(reason, self.last_round_ns or time.time_ns())
        if not chosen and not self.ranks:
            # A sidecar restarted after the trainer died: serve the newest capture it kept on disk.
            on_disk = await asyncio.to_thread(self.evidence.read_latest_from_disk)
            if on_disk is not None:
                return await asyncio.to_thread(gzip.decompress, on_disk), on_disk, "stall"

        def render() -> tuple[bytes, bytes]:
            pieces: list[tuple[int, bytes]] = []
            for rank, item in chosen:
                piece = item if isinstance(item, bytes) else _live_piece(item)
                if piece is not None:
                    if last_entries is not None:
                        piece = _newest_entries(piece, last_entries)
                    pieces.append((rank, piece))
            return _assemble(head, pieces, errors, self.config.max_snapshot_bytes)

        body, body_gz = await asyncio.to_thread(render)
        return body, body_gz, reason

    async def _snapshot_gz(self, reason: str) -> bytes:
        return (await self._snapshot(reason))[1]

    async def refresh(self) -> None:
        """?refresh=1: poll every rank now, recorders and stacks (rate-limited)."""
        if time.monotonic() - self._last_refresh < MIN_REFRESH_INTERVAL_S:
            return
        await self.poll_once(stacks=True, full=True)
        self._last_refresh = time.monotonic()
        self.metrics.dumps_collected.labels(kind="refresh").inc(sum(1 for s in self.ranks.values() if s.up))

    # -- status -------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now_ns = time.time_ns()
        ranks: dict[str, Any] = {}
        for rank, state in sorted(self.ranks.items()):
            groups: dict[str, Any] = {}
            for pg, group in sorted(self.tracker.for_rank(rank).items()):
                sample = group.sample
                age = group.inflight_age_s(now_ns)
                groups[pg] = {
                    "desc": sample.desc,
                    "last_enqueued_seq": sample.last_enqueued_seq,
                    "last_completed_seq": sample.last_completed_seq,
                    "inflight_op": sample.inflight_op,
                    "inflight_seq": sample.inflight_seq,
                    "inflight_age_s": round(age, 3) if age is not None else None,
                    "stalled": group.stalled,
                    "stalled_since_ns": group.stalled_since_ns,
                    "no_progress_s": round((now_ns - group.progress_ns) / 1e9, 3),
                    "stall_threshold_s": group.threshold_s,
                }
            ranks[str(rank)] = {
                "up": state.up,
                "error": state.error,
                "last_poll_ns": state.last_poll_ns,
                "last_ok_ns": state.last_ok_ns,
                "recorder_ns": state.raw_ns,
                "progress_probe": (state.probe[0] or None) if state.probe is not None else None,
                "groups": groups,
            }
        capture = self.evidence.latest()
        dump_files = []
        if self.dumps is not None:
            dump_files = [
                {"path": str(f.path), "rank": f.rank, "state": f.state, "entries": f.entries, "error": f.error}
                for f in sorted(self.dumps.files.values(), key=lambda f: str(f.path))
            ]
        return {
            "schema": STATUS_SCHEMA,
            "pod": self.config.pod,
            "namespace": self.config.namespace,
            "node": self.config.node,
            "captured_at_ns": self.last_round_ns or now_ns,
            "stalled": any(g.stalled for g in self.tracker.groups.values()),
            "ranks": ranks,
            "dump_dir": {
                "path": str(self.config.dump_dir) if self.config.dump_dir else None,
                "exists": self.dumps.exists if self.dumps is not None else None,
                "files": dump_files,
            },
            "evidence": {
                "dir": str(self.config.evidence_dir) if self.config.evidence_dir else None,
                "captures_in_memory": len(self.evidence.memory),
                "files_on_disk": len(self.evidence.on_disk),
                "latest_capture_ns": capture.captured_at_ns if capture else None,
                "last_error": self.evidence.last_error,
            },
        }

    def _update_progress_metrics(self, now_ns: int) -> None:
        m = self.metrics
        for (rank, pg), group in self.tracker.groups.items():
            labels = {"rank": str(rank), "pg": pg}
            sample = group.sample
            if sample.last_enqueued_seq is not None:
                m.last_enqueued.labels(**labels).set(sample.last_enqueued_seq)
            if sample.last_completed_seq is not None:
                m.last_completed.labels(**labels).set(sample.last_completed_seq)
            m.stalled.labels(**labels).set(1 if group.stalled else 0)
            m.inflight_age.labels(**labels).set(group.inflight_age_s(now_ns) or 0.0)
            m.stall_threshold.labels(**labels).set(group.threshold_s)

    def _update_evidence_metrics(self) -> None:
        self.metrics.evidence_files.set(len(self.evidence.on_disk))
        self.metrics.evidence_bytes.set(self.evidence.total_bytes)

    # -- HTTP ---------------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_middleware], client_max_size=1024 * 1024)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", _metrics_handler(self.registry))
        app.router.add_get("/v1/status", self._status)
        app.router.add_get("/v1/snapshot", self._snapshot_handler)
        return app

    @web.middleware
    async def _auth_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # With Kubernetes identity /metrics stays open too (Prometheus has no operator token; the chart's
        # NetworkPolicy says who may reach the port); with a shared token it is protected as before.
        if request.path in PROBES or (self.verifier is not None and request.path == "/metrics"):
            return await handler(request)
        if self.verifier is not None:
            try:
                await self.verifier.check(request.headers.get("Authorization", ""))
            except TokenRejected as exc:
                headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
                return web.json_response({"error": exc.reason}, status=exc.status, headers=headers)
            return await handler(request)
        if self._token is None:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token.encode()):
            return web.json_response(
                {"error": "missing or wrong bearer token"}, status=401, headers={"WWW-Authenticate": "Bearer"}
            )
        return await handler(request)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.ready:
            return web.json_response({"ready": True, "ranks": len(self.ranks)})
        return web.json_response({"ready": False}, status=503)

    async def _status(self, request: web.Request) -> web.Response:
        text = json.dumps(self.status())
        resp = web.Response(text=text, content_type="application/json")
        if len(text) > 1024 and "gzip" in request.headers.get("Accept-Encoding", "").lower():
            resp.enable_compression(web.ContentCoding.gzip)
        return resp

    async def _snapshot_handler(self, request: web.Request) -> web.Response:
        refresh = request.query.get("refresh", "") in ("1", "true", "yes")
        last_entries: int | None = None
        if "entries" in request.query:
            try:
                last_entries = int(request.query["entries"])
                if last_entries < 1:
                    raise ValueError
            except ValueError:
                raise web.HTTPBadRequest(text="entries must be a positive integer") from None
        if refresh:
            await self.refresh()
        body, body_gz, _reason = await self._snapshot(
            "refresh" if refresh else "poll", prefer_live=refresh, last_entries=last_entries
        )
        if "gzip" in request.headers.get("Accept-Encoding", "").lower():
            return web.Response(body=body_gz, content_type="application/json",
                                headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})
        return web.Response(body=body, content_type="application/json", headers={"Vary": "Accept-Encoding"})


def _metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """prometheus-client's aiohttp handler (0.21+) with the injected registry; else generate_latest."""
    try:
        from prometheus_client.aiohttp import make_aiohttp_handler
    except ImportError:  # pragma: no cover - older prometheus-client
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        async def fallback(request: web.Request) -> web.Response:
            resp = web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
            resp.enable_compression()
            return resp

        return fallback
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]] = make_aiohttp_handler(registry)
    return handler


def _write_port_file(path: Path, port: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(path)
