"""Client side of the sidecar HTTP API (docs/sidecar-api.md): `/v1/status` and `/v1/snapshot`.

The documents themselves are frscope.wire's; this module is the transport (HTTP, gzip, size caps).

Answers are validated into small typed objects; anything else is a `SidecarError` naming the pod,
so that a sidecar that is down or answers garbage becomes a missing pod in the report, never a crash.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from frscope import wire
from frscope.operator.evidence.sidecar_tls import SidecarCa, server_name
from frscope.operator.kube.api_errors import KubeError
from frscope.operator.kube.bodies import read_capped, write_capped
from frscope.operator.kube.credentials import BearerAuth
from frscope.wire import SidecarSnapshot, SidecarStatus

DEFAULT_MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
MAX_STATUS_BYTES = wire.STATUS_MAX_BYTES
# A live sidecar accepts a connection within milliseconds; a pod whose network is gone (it ended a moment
# ago, the pod watch has not said so yet) may drop the SYN without an answer, which only the request's
# whole timeout (30 s) would end, once per attempt. A connection not made in this long is retried.
CONNECT_TIMEOUT_S = 5.0

class SidecarError(Exception):
    """A sidecar could not be reached or did not answer as documented."""

    def __init__(self, endpoint: str, message: str, *, retryable: bool = True) -> None:
        super().__init__(f"{endpoint}: {message}")
        self.endpoint = endpoint
        self.message = message
        self.retryable = retryable

    def __reduce__(self) -> tuple[object, ...]:
        # Raised in decoder processes too: travel back whole.
        return (_rebuild_sidecar_error, (self.endpoint, self.message, self.retryable))


def _rebuild_sidecar_error(endpoint: str, message: str, retryable: bool) -> SidecarError:
    return SidecarError(endpoint, message, retryable=retryable)


def parse_status(obj: Any, endpoint: str = "") -> SidecarStatus:
    """frscope.wire.parse_status, its refusal as a SidecarError naming the sidecar."""
    try:
        return wire.parse_status(obj)
    except wire.WireError as exc:
        raise SidecarError(endpoint, str(exc), retryable=False) from None


def parse_snapshot(obj: Any, endpoint: str = "", size_bytes: int = 0) -> SidecarSnapshot:
    """frscope.wire.parse_snapshot, its refusal as a SidecarError naming the sidecar."""
    try:
        return wire.parse_snapshot(obj, size_bytes)
    except wire.WireError as exc:
        raise SidecarError(endpoint, str(exc), retryable=False) from None


def gunzip_capped(raw: bytes, limit: int, endpoint: str) -> bytes:
    """Undo gzip (when the body is gzip), refusing more than `limit` bytes out."""
    if raw[:2] != b"\x1f\x8b":
        return raw
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise SidecarError(endpoint, f"corrupt gzip: {exc}", retryable=False) from exc
    if len(out) > limit:
        raise SidecarError(endpoint, f"answer larger than {limit} bytes once decompressed", retryable=False)
    if not inflater.eof:
        raise SidecarError(endpoint, "gzip stream ends early", retryable=False)
    return out


@dataclass(frozen=True, slots=True)
class SnapshotFetch:
    """A `/v1/snapshot` answer as fetched: its body (b"" when written to a file, or not modified), its ETag
    (frscope.wire.read_etag: None when it gave none, or one past the bounds), and whether the sidecar said
    304 Not Modified to the ETag asked with (`if_none_match`)."""

    body: bytes
    etag: str | None
    not_modified: bool = False


class PodTokenSource(Protocol):
    """Per-pod tokens (`kube.pod_tokens.PodTokens`): the one a pod's sidecar accepts, and no other."""

    async def token(self, namespace: str, pod: str) -> str: ...

    def forget(self, namespace: str, pod: str) -> None: ...


class SidecarClient:
    """Talks to sidecars over one shared aiohttp session (connection pooling across 1,000s of pods).

    With a session made with `auto_decompress=False` (the operator's), snapshot bodies stay gzipped
    until a decoder process inflates them: the event loop's process never inflates ~1 GiB of JSON."""

    def __init__(self, session: aiohttp.ClientSession, *, auth: BearerAuth | None = None,
                 tokens: PodTokenSource | None = None, max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
                 tls: SidecarCa | None = None) -> None:
        self._session = session
        # The operator's token for the sidecars: asked for per request (a projected token rotates). With
        # `tokens`, each pod's own (minted for that pod's audience) and never a shared one.
        self._auth = auth
        self._tokens = tokens
        self._max_snapshot = max_snapshot_bytes
        # With TLS (`--sidecar-ca-dir`): HTTPS only, the CA alone trusted, and the certificate must name
        # the pod asked (`server_name`): no plain-HTTP fallback, or a tenant could downgrade its pod.
        self._tls = tls

    async def _headers(self, endpoint: str, pod: tuple[str, str] | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip"}
        if self._tokens is not None:
            if pod is None:
                return headers  # no pod named: no credential at all
            try:
                token: str | None = await self._tokens.token(*pod)
            except KubeError as exc:
                raise SidecarError(endpoint, f"no token for the pod's sidecar: {exc}") from exc
        else:
            token = self._auth.token() if self._auth is not None else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def _get_bytes(self, url: str, endpoint: str, timeout_s: float, limit: int,
                         pod: tuple[str, str] | None = None, times: list[int] | None = None,
                         into: Path | None = None, if_none_match: str | None = None) -> SnapshotFetch:
        """`times`: gets this process' wall clock just before the request and when the answer's head
        arrived (the answer was made between the two). `into`: the body goes to that file instead (b"").
        `if_none_match`: a conditional request (the ETag the same sidecar gave before); a 304 to any other
        request is refused."""
        tls: dict[str, Any] = {}
        if self._tls is not None:
            if pod is None:
                raise SidecarError(endpoint, "TLS: no pod named, so no certificate name to expect", retryable=False)
            if url.startswith("http://"):
                url = "https://" + url[len("http://"):]
            tls = {"ssl": self._tls.client_context(), "server_hostname": server_name(*pod)}
        headers = await self._headers(endpoint, pod)
        if if_none_match is not None:
            headers["If-None-Match"] = if_none_match
        if tls:
            # Not kept alive: asyncio holds a 256 KiB buffer per open TLS connection (bench/sidecar_tls.py:
            # 265 KiB each, 6 KiB for plain HTTP), which idle connections to 1,000s of sidecars would hold
            # for the keep-alive time; a new handshake costs ~1.4 ms of CPU instead.
            headers["Connection"] = "close"
        try:
            asked = time.time_ns()
            limits = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, CONNECT_TIMEOUT_S))
            async with self._session.get(url, headers=headers, timeout=limits, **tls) as resp:
                if times is not None:
                    times[:] = [asked, time.time_ns()]
                if resp.status == 401 and self._tokens is not None and pod is not None:
                    self._tokens.forget(*pod)  # minted again at the next ask
                etag = wire.read_etag(resp.headers.get("ETag"))
                if resp.status == 304:
                    if if_none_match is None:
                        raise SidecarError(endpoint, "HTTP 304 Not Modified to a request that named no ETag",
                                           retryable=False)
                    return SnapshotFetch(b"", etag, not_modified=True)
                if resp.status != 200:
                    text = (await resp.content.read(300)).decode("utf-8", "replace")
                    raise SidecarError(endpoint, f"HTTP {resp.status}: {' '.join(text.split())[:200]}",
                                       retryable=resp.status >= 500 or resp.status == 429)
                if into is not None:
                    size = await write_capped(resp, into, limit)
                    raw = b""
                else:
                    raw = await read_capped(resp, limit)
                    size = len(raw)
        except aiohttp.ClientConnectorCertificateError as exc:
            # Not the pod's own sidecar (another CA, another pod's name, or not issued yet): never trusted.
            raise SidecarError(endpoint, f"TLS: the sidecar's certificate is refused: {exc.certificate_error}",
                               retryable=False) from exc
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise SidecarError(endpoint, f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
        if size > limit:
            raise SidecarError(endpoint, f"answer larger than {limit} bytes", retryable=False)
        return SnapshotFetch(raw, etag)

    async def status(self, endpoint: str, timeout_s: float, *, pod: tuple[str, str] | None = None) -> SidecarStatus:
        """`pod`: (namespace, name) of the pod whose sidecar this is (its token is the one shown)."""
        times: list[int] = []
        got = await self._get_bytes(f"{endpoint}/v1/status", endpoint, timeout_s, MAX_STATUS_BYTES, pod, times)
        raw = gunzip_capped(got.body, MAX_STATUS_BYTES, endpoint)
        try:
            # Off the event loop: one sidecar's answer must not stall the operator's other work.
            status = await asyncio.to_thread(wire.loads_status, raw)
        except wire.WireError as exc:
            raise SidecarError(endpoint, str(exc), retryable=False) from None
        return replace(status, asked_ns=times[0], received_ns=times[1]) if times else status

    async def snapshot_bytes(
        self, endpoint: str, timeout_s: float, *, refresh: bool = True, last_entries: int | None = None,
        pod: tuple[str, str] | None = None, into: Path | None = None,
    ) -> bytes:
        """The `/v1/snapshot` body, undecoded and maybe gzipped (`evidence.from_bytes` takes both, off the
        event loop); with `into`, written to that file as it arrives (b"" returned)."""
        got = await self.snapshot(endpoint, timeout_s, refresh=refresh, last_entries=last_entries, pod=pod, into=into)
        return got.body

    async def snapshot(
        self, endpoint: str, timeout_s: float, *, refresh: bool = True, last_entries: int | None = None,
        pod: tuple[str, str] | None = None, into: Path | None = None, if_none_match: str | None = None,
    ) -> SnapshotFetch:
        """`snapshot_bytes` with the answer's ETag; `if_none_match`: the ETag this same sidecar gave for the
        answer kept (a 304 then leaves the body out, and `into` untouched)."""
        query = [("refresh", "1")] if refresh else []
        window = wire.window_query(last_entries)
        if window is not None:
            # Only the newest entries per rank travel: the operator keeps no more than these.
            query.append(("entries", window))
        url = f"{endpoint}/v1/snapshot" + ("?" + "&".join(f"{k}={v}" for k, v in query) if query else "")
        return await self._get_bytes(url, endpoint, timeout_s, self._max_snapshot, pod, into=into,
                                     if_none_match=if_none_match)
