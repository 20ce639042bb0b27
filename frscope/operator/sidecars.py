"""Client side of the sidecar HTTP API (docs/sidecar-api.md): `/v1/status` and `/v1/snapshot`.

Answers are validated into small typed objects; anything else is a `SidecarError` naming the pod,
so that a sidecar that is down or answers garbage becomes a missing pod in the report, never a crash.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from frscope.operator.bodies import read_capped
from frscope.operator.kube.credentials import BearerAuth

STATUS_SCHEMA = "frscope.sidecar.status/v1"
SNAPSHOT_SCHEMA = "frscope.sidecar.snapshot/v1"
DEFAULT_MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
MAX_STATUS_BYTES = 8 * 1024 * 1024


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


@dataclass(frozen=True, slots=True)
class GroupStall:
    rank: int
    group: str
    desc: str
    op: str | None
    seq: int | None
    age_s: float | None


@dataclass(frozen=True, slots=True)
class RankUp:
    """One rank as the sidecar last polled it: `up` (answered), else `error` (why not)."""

    rank: int
    up: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class SidecarStatus:
    pod: str
    namespace: str
    stalled: bool
    stalls: tuple[GroupStall, ...]
    ranks_up: int
    ranks_down: int
    ranks: tuple[RankUp, ...] = ()  # per rank, by rank (the web UI's per-rank status)


@dataclass(slots=True)
class SidecarSnapshot:
    """One pod's `/v1/snapshot` (or pushed) body. `ranks` are frscope snapshots, undecoded further."""

    pod: str
    namespace: str
    captured_at_ns: int | None
    reason: str
    ranks: list[dict[str, Any]]
    errors: list[tuple[int | None, str]] = field(default_factory=list)
    size_bytes: int = 0


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_status(obj: Any, endpoint: str = "") -> SidecarStatus:
    if not isinstance(obj, dict) or obj.get("schema") != STATUS_SCHEMA:
        raise SidecarError(endpoint, f"/v1/status: not a {STATUS_SCHEMA} object", retryable=False)
    stalls: list[GroupStall] = []
    per_rank: list[RankUp] = []
    up = down = 0
    ranks = obj.get("ranks")
    for rank_text, rank_obj in (ranks.items() if isinstance(ranks, dict) else []):
        if not isinstance(rank_obj, dict):
            continue
        if rank_obj.get("up"):
            up += 1
        else:
            down += 1
        try:
            rank = int(rank_text)
        except ValueError:
            continue
        error = rank_obj.get("error")
        per_rank.append(RankUp(rank, bool(rank_obj.get("up")), str(error)[:200] if error else None))
        groups = rank_obj.get("groups")
        for group, g in (groups.items() if isinstance(groups, dict) else []):
            if isinstance(g, dict) and g.get("stalled"):
                age = g.get("inflight_age_s")
                stalls.append(GroupStall(rank, str(group), str(g.get("desc") or ""),
                                         str(g["inflight_op"]) if g.get("inflight_op") else None,
                                         _int(g.get("inflight_seq")),
                                         float(age) if isinstance(age, (int, float)) else None))
    return SidecarStatus(
        pod=str(obj.get("pod") or ""), namespace=str(obj.get("namespace") or ""),
        stalled=bool(obj.get("stalled")) or bool(stalls), stalls=tuple(stalls), ranks_up=up, ranks_down=down,
        ranks=tuple(sorted(per_rank, key=lambda r: r.rank)),
    )


def parse_snapshot(obj: Any, endpoint: str = "", size_bytes: int = 0) -> SidecarSnapshot:
    """Validate the envelope; each rank's snapshot is checked later by frscope.records."""
    if not isinstance(obj, dict) or obj.get("schema") != SNAPSHOT_SCHEMA:
        raise SidecarError(endpoint, f"snapshot: not a {SNAPSHOT_SCHEMA} object", retryable=False)
    ranks = obj.get("ranks")
    if not isinstance(ranks, list):
        raise SidecarError(endpoint, "snapshot: 'ranks' is not a list", retryable=False)
    errors: list[tuple[int | None, str]] = []
    for err in obj.get("errors") or []:
        if isinstance(err, dict):
            errors.append((_int(err.get("rank")), str(err.get("message") or "")[:500]))
    return SidecarSnapshot(
        pod=str(obj.get("pod") or ""), namespace=str(obj.get("namespace") or ""),
        captured_at_ns=_int(obj.get("captured_at_ns")), reason=str(obj.get("reason") or ""),
        ranks=[r for r in ranks if isinstance(r, dict)], errors=errors, size_bytes=size_bytes,
    )


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


class SidecarClient:
    """Talks to sidecars over one shared aiohttp session (connection pooling across 1,000s of pods).

    With a session made with `auto_decompress=False` (the operator's), snapshot bodies stay gzipped
    until a decoder process inflates them: the event loop's process never inflates ~1 GiB of JSON."""

    def __init__(self, session: aiohttp.ClientSession, *, auth: BearerAuth | None = None,
                 max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES) -> None:
        self._session = session
        # The operator's token for the sidecars: asked for per request (a projected token rotates).
        self._auth = auth
        self._max_snapshot = max_snapshot_bytes

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip"}
        token = self._auth.token() if self._auth is not None else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def _get_bytes(self, url: str, endpoint: str, timeout_s: float, limit: int) -> bytes:
        try:
            async with self._session.get(url, headers=self._headers(),
                                         timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status != 200:
                    text = (await resp.content.read(300)).decode("utf-8", "replace")
                    raise SidecarError(endpoint, f"HTTP {resp.status}: {' '.join(text.split())[:200]}",
                                       retryable=resp.status >= 500 or resp.status == 429)
                raw = await read_capped(resp, limit)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise SidecarError(endpoint, f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
        if len(raw) > limit:
            raise SidecarError(endpoint, f"answer larger than {limit} bytes", retryable=False)
        return raw

    async def status(self, endpoint: str, timeout_s: float) -> SidecarStatus:
        raw = await self._get_bytes(f"{endpoint}/v1/status", endpoint, timeout_s, MAX_STATUS_BYTES)
        raw = gunzip_capped(raw, MAX_STATUS_BYTES, endpoint)
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise SidecarError(endpoint, f"answer is not JSON: {exc}", retryable=False) from exc
        return parse_status(obj, endpoint)

    async def snapshot_bytes(
        self, endpoint: str, timeout_s: float, *, refresh: bool = True, last_entries: int | None = None
    ) -> bytes:
        """The `/v1/snapshot` body, undecoded and maybe gzipped (`evidence.from_bytes` takes both, off the
        event loop)."""
        query = [("refresh", "1")] if refresh else []
        if last_entries:
            # Only the newest entries per rank travel: the operator keeps no more than these.
            query.append(("entries", str(last_entries)))
        url = f"{endpoint}/v1/snapshot" + ("?" + "&".join(f"{k}={v}" for k, v in query) if query else "")
        return await self._get_bytes(url, endpoint, timeout_s, self._max_snapshot)
