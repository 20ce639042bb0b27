"""Fetch every rank's snapshot from all of a job's sidecars, concurrently, within deadlines.

Each pod gets `attempts` tries of at most `per_pod_timeout_s` each (backoff between them); the whole
gather stops once `overall_timeout_s` have passed with no pod's answer arriving, and at `limit_s` in all: a
job of 10,000s of pods queues behind `concurrency` for longer than one deadline, and a pod cut off while
answers still come would be reported as a rank without evidence. Each body is decoded and normalized as
soon as it arrives, in a worker thread (`pod_evidence.from_bytes`, at most `decode_threads` at once), so
the raw JSON of 1,000s of ranks is never held at once. A pod that could not be fetched is a failure with
its reason, which the report names, unless a push of it stands in (`settle.collect`). Never raises for a
pod.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

from frscope.operator.evidence.group_lists import GroupTable, packed_call, unpack
from frscope.operator.evidence.pod_evidence import DEFAULT_MAX_ENTRIES, MAX_PIECES, PodEvidence, from_bytes
from frscope.operator.evidence.push_decode import decode_file
from frscope.operator.evidence.sidecars import SidecarClient, SidecarError
from frscope.operator.kube.backoff import Backoff

# How often a decoder process checks that the operator process is still its parent.
PARENT_CHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class GatherOptions:
    per_pod_timeout_s: float = 30.0
    overall_timeout_s: float = 120.0  # the gather ends this long after the last answer arrived (or its start)
    limit_s: float = 600.0  # ... and at this long after its start, whatever still arrives
    attempts: int = 3
    backoff_base_s: float = 0.5
    concurrency: int = 32
    decode_threads: int = 2  # bodies decoded at once (threads, or as many as there are processes)
    max_entries: int = DEFAULT_MAX_ENTRIES
    refresh: bool = True
    max_ranks: int = MAX_PIECES  # ranks kept of one pod's answer (the live windows keep fewer)
    # Where answers are streamed to be decoded from their file (never whole in this process: the live
    # windows); None: read into memory, then decoded.
    spool: Path | None = None


class Decoder:
    """Decodes snapshot bodies off the event loop. JSON decoding is most of a gather's CPU (a 1,024-rank
    job sends ~1 GiB of it) and holds the GIL: with `processes` > 0 it runs in that many worker processes
    (spawned once, reused), in parallel on as many cores; with 0, in threads."""

    def __init__(self, processes: int = 0) -> None:
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None
        if processes > 0:
            self._pool = _pool(processes)

    async def warm_up(self) -> None:
        """Start the worker processes now rather than during the first gather."""
        if self._pool is not None:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(self._pool, _noop) for _ in range(self.processes)))

    async def decode(self, raw: bytes, endpoint: str, *, max_entries: int, pod: str | None, namespace: str | None,
                     shared: GroupTable | None = None,
                     origin: str = "sidecar", max_ranks: int = MAX_PIECES) -> PodEvidence:
        """`shared`: the gather's rank lists (`group_lists.GroupTable`), one tuple per distinct list.
        `origin`: 'sidecar' (a fetched snapshot) or 'push'."""
        call = functools.partial(from_bytes, raw, endpoint, origin=origin, max_entries=max_entries, pod=pod,
                                 namespace=namespace, max_ranks=max_ranks)
        return await self._run(call, endpoint, shared)

    async def decode_file(self, path: str, endpoint: str, *, max_entries: int, pod: str | None,
                          namespace: str | None, origin: str = "push", plain_bytes: int = 0,
                          max_ranks: int = MAX_PIECES, shared: GroupTable | None = None,
                          unchanged_if: bytes = b"", with_digest: bool = False) -> PodEvidence:
        """A body streamed into the file `path` (a push, a push kept on disk), decoded one rank at a time
        (`push_decode.decode_file`) in a decoder process: the operator's process never holds the body.
        `unchanged_if`: the digest of the body decoded before (an `unchanged` evidence if it is the same)."""
        call = functools.partial(decode_file, path, endpoint, origin=origin, max_entries=max_entries, pod=pod,
                                 namespace=namespace, plain_bytes=plain_bytes, max_ranks=max_ranks,
                                 unchanged_if=unchanged_if, with_digest=with_digest)
        return await self._run(call, endpoint, shared)

    async def _run(self, call: functools.partial[PodEvidence], endpoint: str,
                   shared: GroupTable | None) -> PodEvidence:
        table = shared if shared is not None else GroupTable()
        if self._pool is None:
            return unpack(await asyncio.to_thread(call), table)  # in-process: nothing packed
        # Large rank lists come back as digests, whole only where this gather has not got them yet.
        packed = functools.partial(packed_call, call.func, table.known(), *call.args, **call.keywords)
        try:
            evidence = await asyncio.get_running_loop().run_in_executor(self._pool, packed)
        except BrokenProcessPool:
            # A body killed its worker (the pool is then unusable): this body fails, the next get a new pool.
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = _pool(self.processes)
            raise SidecarError(endpoint, "the decoder process died decoding this body", retryable=False) from None
        return unpack(evidence, table)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _noop() -> None:
    return None


def _pool(processes: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_end_with, initargs=(os.getpid(),))


def _end_with(parent: int) -> None:
    """In each decoder process: exit once the operator process is gone. A SIGKILLed or OOM-killed
    operator cannot shut its pool down, and its workers would otherwise wait for work forever."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="frscope-parent-watch", daemon=True).start()


@dataclass(frozen=True, slots=True)
class Target:
    """One pod to gather from. `endpoint` is None when the pod has no IP or no sidecar port, or when
    `ended` says why it is not asked (its pushes still count)."""

    pod: str
    endpoint: str | None
    ended: str | None = None
    uid: str = ""  # the pod's uid: a push from an earlier pod of the same name (another uid) is not its


@dataclass(slots=True)
class Gathered:
    namespace: str
    pods: dict[str, PodEvidence] = field(default_factory=dict)
    from_push: set[str] = field(default_factory=set)  # pods whose evidence came from a push
    failures: dict[str, str] = field(default_factory=dict)  # pod -> why it could not be fetched
    duration_s: float = 0.0

    @property
    def anything(self) -> bool:
        return any(e.dumps for e in self.pods.values())

    @property
    def entries_dropped(self) -> int:
        return sum(e.entries_dropped for e in self.pods.values())


async def _fetch_one(client: SidecarClient, namespace: str, target: Target, options: GatherOptions,
                     fetching: asyncio.Semaphore, decoding: asyncio.Semaphore, decoder: Decoder,
                     shared: GroupTable, previous: PodEvidence | None) -> PodEvidence:
    assert target.endpoint is not None
    delays = Backoff(attempts=options.attempts, base_s=options.backoff_base_s, cap_s=5.0).delays()
    while True:
        try:
            # A fetched body is held until it is decoded: at most `concurrency` raw bodies in memory.
            async with fetching:
                if options.spool is not None:
                    return await _fetch_to_file(client, namespace, target, options, options.spool, decoding,
                                                decoder, shared, previous)
                raw = await client.snapshot_bytes(target.endpoint, options.per_pod_timeout_s,
                                                  refresh=options.refresh,
                                                  last_entries=options.max_entries or None,
                                                  pod=(namespace, target.pod))
                async with decoding:
                    return await decoder.decode(raw, target.endpoint, max_entries=options.max_entries,
                                                pod=target.pod, namespace=namespace, shared=shared,
                                                max_ranks=options.max_ranks)
        except SidecarError as exc:
            delay = next(delays, None) if exc.retryable else None
            if delay is None:
                raise
            await asyncio.sleep(delay)


async def _fetch_to_file(client: SidecarClient, namespace: str, target: Target, options: GatherOptions,
                         spool: Path, decoding: asyncio.Semaphore, decoder: Decoder,
                         shared: GroupTable, previous: PodEvidence | None) -> PodEvidence:
    """One answer streamed to a file of `spool` and decoded from it in the decoder processes. `previous`
    (this pod's evidence from the same kind of gather before) is kept as it is when its sidecar answers
    304 to the ETag it gave for it (nothing fetched, nothing decoded), or when the answer holds the same
    ranks and errors, byte for byte (a sidecar that gives no ETag)."""
    assert target.endpoint is not None
    asked_of = f"{target.uid} {target.endpoint}"
    # Only the very sidecar that gave the ETag is asked with it (a pod of the same name is another).
    if_none_match = previous.etag if previous is not None and previous.etag and previous.validated_by == asked_of \
        else None
    fd, name = tempfile.mkstemp(dir=spool, prefix=".snapshot-", suffix=".part")
    os.close(fd)
    path = Path(name)
    try:
        got = await client.snapshot(target.endpoint, options.per_pod_timeout_s, refresh=options.refresh,
                                    last_entries=options.max_entries or None, pod=(namespace, target.pod), into=path,
                                    if_none_match=if_none_match)
        if got.not_modified and previous is not None:
            return previous
        async with decoding:
            evidence = await decoder.decode_file(str(path), target.endpoint, origin="sidecar",
                                                 max_entries=options.max_entries, pod=target.pod,
                                                 namespace=namespace, max_ranks=options.max_ranks, shared=shared,
                                                 unchanged_if=previous.digest if previous is not None else b"",
                                                 with_digest=True)
        if evidence.unchanged and previous is not None:
            evidence = previous
        evidence.etag, evidence.validated_by = got.etag or "", asked_of if got.etag else ""
        return evidence
    finally:
        path.unlink(missing_ok=True)


async def _cancel_all(tasks: list[asyncio.Task[PodEvidence]]) -> None:
    """Cancel `tasks` and wait until every one has ended, even when the waiting itself is cancelled
    (a second cancel of the gather must not leave them running)."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    waiting = asyncio.gather(*tasks, return_exceptions=True)
    cancelled = False
    while True:
        try:
            await asyncio.shield(waiting)
            break
        except asyncio.CancelledError:
            cancelled = True  # cancelled again meanwhile: the fetches end first, then it goes on
    if cancelled:
        raise asyncio.CancelledError


async def _wait_while_arriving(pending: set[asyncio.Task[PodEvidence]], options: GatherOptions,
                               started: float) -> set[asyncio.Task[PodEvidence]]:
    """Wait for `pending` until `overall_timeout_s` pass with no answer arriving (a pod's evidence, not a
    failure), or `limit_s` since `started`; the tasks still pending then. Each task notes its own arrival
    (a callback), and one waiter covers them all: waking once per arrival over 10,000s of tasks would cost
    a pass over all of them each time."""
    last = [started]

    def arrived(task: asyncio.Task[PodEvidence]) -> None:
        if not task.cancelled() and task.exception() is None:
            last[0] = time.monotonic()

    for task in pending:
        task.add_done_callback(arrived)
    every = asyncio.ensure_future(asyncio.wait(pending))
    end = started + max(options.limit_s, options.overall_timeout_s)
    try:
        while not every.done():
            timeout = min(end, last[0] + options.overall_timeout_s) - time.monotonic()
            if timeout <= 0:
                break
            await asyncio.wait({every}, timeout=timeout)
    finally:
        every.cancel()  # the waiter only: the fetches are the caller's to cancel
    return {t for t in pending if not t.done()}


async def gather(client: SidecarClient, namespace: str, targets: list[Target], options: GatherOptions,
                 decoder: Decoder | None = None, previous: Mapping[str, PodEvidence] | None = None) -> Gathered:
    """Every target fetched (what they pushed is added by `settle.collect`). `previous`: each pod's
    evidence from the last gather of the same options (the live windows'); with `options.spool`, a pod
    whose answer holds the same bytes is not decoded again, and its evidence is that same object."""
    started = time.monotonic()
    result = Gathered(namespace)
    decoder = decoder or Decoder()
    fetching = asyncio.Semaphore(max(1, options.concurrency))
    decoding = asyncio.Semaphore(max(1, decoder.processes or options.decode_threads))
    tasks: dict[asyncio.Task[PodEvidence], Target] = {}
    shared = GroupTable()
    for target in targets:
        if target.ended is not None:
            result.failures[target.pod] = target.ended
            continue
        if target.endpoint is None:
            result.failures[target.pod] = "no sidecar endpoint (no pod IP yet, or no container port named 'frscope')"
            continue
        before = previous.get(target.pod) if previous is not None else None
        tasks[asyncio.create_task(_fetch_one(client, namespace, target, options, fetching, decoding,
                                             decoder, shared, before))] = target
    if tasks:
        pending: set[asyncio.Task[PodEvidence]] = set(tasks)
        try:
            pending = await _wait_while_arriving(pending, options, started)
        finally:
            # The deadline, or the gather itself cancelled (the job deleted, the operator stopping): no
            # fetch or decode outlives it.
            await _cancel_all([t for t in tasks if not t.done()])
        for task, target in tasks.items():
            if task in pending:
                result.failures[target.pod] = (
                    f"no answer within the gather deadline ({options.overall_timeout_s:g} s with no pod's answer "
                    f"arriving, {max(options.limit_s, options.overall_timeout_s):g} s at most)")
                continue
            exc = task.exception()
            if isinstance(exc, SidecarError):
                result.failures[target.pod] = exc.message
            elif exc is not None:
                result.failures[target.pod] = f"{type(exc).__name__}: {exc}"
            else:
                result.pods[target.pod] = task.result()
    result.duration_s = time.monotonic() - started
    return result
