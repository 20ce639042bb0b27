"""Async client for torch's worker server (`_WorkerServer`): on the unix socket frscope's bootstrap starts it
on, or on the TCP port where torch's own debug server (`torch.distributed.debug.start_debug_server()`)
started it, read on the pod's loopback.

Handlers used: `POST /handler/fr_trace_json`, `POST /handler/dump_traceback`, `POST /handler/ping`.
Every request has a timeout and every answer a size cap: the rank on the other end may be wedged,
dead, or (through a misconfigured volume) not torch at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from frscope.wire import TIMINGS_MAX_BYTES

# The cheap progress probes, tried in this order. `frscope_progress` is registered by the bootstrap
# (sitecustomize) and answers the pg_status of torch's recorders without their entries
# (`_dump_fr_trace_json(includeCollectives=False)`, gloo's and every non-NCCL recorder, and the NCCL
# one where the build has it); `dump_nccl_trace_json` is torch's own and covers ProcessGroupNCCL only
# (it answers an empty pg_status for gloo).
PROGRESS_PROBES = (("frscope_progress", ""), ("dump_nccl_trace_json", "?includecollectives=false&onlyactive=true"))
PROBE_MAX_BYTES = 1024 * 1024
# One progress fingerprint item: (recorder, pg uid, last enqueued, last started, last completed).
Fingerprint = tuple[tuple[str, str, int, int, int], ...]


def parse_probe(body: bytes) -> tuple[Fingerprint, bool]:
    """(fingerprint, something in flight) from a probe answer; ValueError if it is not one."""
    obj = json.loads(body)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    recorders: Any = obj.get("recorders") if "recorders" in obj else {"": obj}
    if not isinstance(recorders, dict):
        raise ValueError("recorders is not an object")
    items: list[tuple[str, str, int, int, int]] = []
    for name, recorder in recorders.items():
        status = recorder.get("pg_status") if isinstance(recorder, dict) else None
        if not isinstance(status, dict):
            raise ValueError("no pg_status")
        for uid, row in status.items():
            if not isinstance(row, dict):
                raise ValueError("pg_status row is not an object")
            items.append((str(name), str(uid), int(row.get("last_enqueued_collective", -1)),
                          int(row.get("last_started_collective", -1)), int(row.get("last_completed_collective", -1))))
    items.sort()
    return tuple(items), any(enq > done for _n, _u, enq, _s, done in items)


# Bounded reason set: these become the `reason` label of frscope_poll_errors_total.
REASONS = ("no_socket", "connect", "timeout", "http", "oversized", "protocol", "decode", "malformed")


@dataclass(frozen=True, slots=True)
class DebugServerPort:
    """A rank's worker server that torch's own debug server started (`torch.distributed.debug.
    start_debug_server()`: `_WorkerServer("::", port)`), read on the pod's loopback; never another host
    (the port comes from a file in the shared socket dir: frscope.sidecar.ranks)."""

    port: int

    def __str__(self) -> str:
        return f"127.0.0.1:{self.port} (torch's debug server)"


# Where a rank's worker server answers: the bootstrap's unix socket, or torch's debug server's port.
Endpoint = Path | DebugServerPort


def source_of(endpoint: Endpoint) -> str:
    """The `source` of a snapshot piece read there."""
    if isinstance(endpoint, DebugServerPort):
        return f"torch-debug-server:127.0.0.1:{endpoint.port}"
    return f"socket:{endpoint}"


class WorkerError(Exception):
    """A rank's worker server did not give a usable answer. `reason` is one of REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class WorkerClient:
    """One rank's worker server. Connections are not reused: a rank that restarts gets a new
    process behind the same path, and a kept-alive connection to the old one would only fail."""

    def __init__(self, endpoint: Endpoint, *, timeout_s: float, max_bytes: int) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector: aiohttp.BaseConnector
            if isinstance(self.endpoint, DebugServerPort):
                connector = aiohttp.TCPConnector(force_close=True, limit=2)
            else:
                connector = aiohttp.UnixConnector(path=str(self.endpoint), force_close=True, limit=2)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    @property
    def base_url(self) -> str:
        if isinstance(self.endpoint, DebugServerPort):
            return f"http://127.0.0.1:{self.endpoint.port}"
        return "http://localhost"

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def call(self, handler: str, *, timeout_s: float | None = None, max_bytes: int | None = None,
                   query: str = "") -> bytes:
        """POST /handler/<handler>; the body of a 200 answer, at most `max_bytes` long."""
        chunks: list[bytes] = []

        async def keep(chunk: bytes) -> None:
            chunks.append(chunk)

        await self._request(handler, keep, timeout_s, max_bytes, query)
        return b"".join(chunks)

    async def call_compressed(self, handler: str) -> tuple[bytes, bytes, int]:
        """Like `call`, but the body is compressed (zlib, level 1) while it streams in, in a worker
        thread: a 1 MB recorder never sits in memory whole before it is parsed. Returns (zlib bytes,
        blake2b-128 digest of the body, body length)."""
        compressor = zlib.compressobj(1)
        digest = hashlib.blake2b(digest_size=16)
        parts: list[bytes] = []
        size = 0

        def feed(chunk: bytes) -> bytes:
            digest.update(chunk)
            return compressor.compress(chunk)

        async def keep(chunk: bytes) -> None:
            nonlocal size
            size += len(chunk)
            parts.append(await asyncio.to_thread(feed, chunk))

        await self._request(handler, keep, None, None)
        parts.append(compressor.flush())
        return b"".join(parts), digest.digest(), size

    async def _request(self, handler: str, consume: Callable[[bytes], Awaitable[None]],
                       timeout_s: float | None, max_bytes: int | None, query: str = "") -> None:
        where = f"{self.endpoint}: {handler}"
        cap = self.max_bytes if max_bytes is None else max_bytes
        limit = self.timeout_s if timeout_s is None else timeout_s
        timeout = aiohttp.ClientTimeout(total=limit, connect=min(limit, 2.0))
        session = self._get_session()
        try:
            async with session.post(f"{self.base_url}/handler/{handler}{query}", data=b"", timeout=timeout) as resp:
                if resp.status != 200:
                    text = (await resp.content.read(200)).decode("utf-8", "replace").strip()
                    raise WorkerError("http", f"{where}: HTTP {resp.status}: {text[:200]}")
                length = resp.content_length
                if length is not None and length > cap:
                    raise WorkerError("oversized", f"{where}: answer of {length} bytes exceeds the cap of {cap}")
                total = 0
                async for chunk in resp.content.iter_chunked(256 * 1024):
                    total += len(chunk)
                    if total > cap:
                        raise WorkerError("oversized", f"{where}: answer exceeds the cap of {cap} bytes")
                    await consume(chunk)
        except WorkerError:
            raise
        except FileNotFoundError as exc:
            raise WorkerError("no_socket", f"{where}: socket is gone") from exc
        except TimeoutError as exc:
            raise WorkerError("timeout", f"{where}: no answer within {limit:g} s") from exc
        except aiohttp.ClientConnectorError as exc:
            reason = "no_socket" if isinstance(exc.os_error, FileNotFoundError) else "connect"
            raise WorkerError(reason, f"{where}: cannot connect: {exc.os_error.strerror or exc.os_error}") from exc
        except (aiohttp.ClientError, ValueError, UnicodeError) as exc:
            raise WorkerError("protocol", f"{where}: bad answer: {type(exc).__name__}: {exc}") from exc
        except OSError as exc:
            raise WorkerError("connect", f"{where}: {exc.strerror or exc}") from exc

    async def fr_trace_json(self) -> tuple[bytes, bytes, int]:
        """The live recorder: (zlib of the JSON, its digest, its length)."""
        return await self.call_compressed("fr_trace_json")

    async def timings(self) -> bytes:
        """The rank's own collective times (the bootstrap's `frscope_timings`, frscope.wire.timings);
        WorkerError("http") where the rank has no such handler (no bootstrap, or an older one)."""
        return await self.call("frscope_timings", max_bytes=min(self.max_bytes, TIMINGS_MAX_BYTES))

    async def dump_traceback(self, timeout_s: float, max_bytes: int) -> str:
        """Every Python thread's stack; cut (with a note) rather than refused when over `max_bytes`."""
        body = await self.call("dump_traceback", timeout_s=timeout_s, max_bytes=max(max_bytes * 8, max_bytes))
        if len(body) > max_bytes:
            body = body[:max_bytes] + b"\n... (cut by frscope at --max-stacks-bytes)\n"
        return body.decode("utf-8", "replace")

    async def probe(self, handler: str, query: str) -> tuple[Fingerprint, bool]:
        """One cheap progress probe. WorkerError("http") if the rank lacks the handler,
        ("decode") if the answer is not a usable probe."""
        body = await self.call(handler, max_bytes=PROBE_MAX_BYTES, query=query)
        try:
            return parse_probe(body)
        except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
            raise WorkerError("decode", f"{self.endpoint}: {handler}: not a progress probe: {exc}") from exc

    async def ping(self) -> bool:
        return (await self.call("ping", max_bytes=4096)).strip() == b"pong"
