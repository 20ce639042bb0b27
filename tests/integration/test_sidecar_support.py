"""Helpers for the sidecar's integration tests (no tests in here): an in-process sidecar on loopback
with an injected registry, polling real rank sockets; waiting; decoding the API's answers."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from frscope.records import RankDump, normalize_dump
from frscope.sidecar.app import Sidecar
from frscope.sidecar.config import SidecarConfig

POLL_S = 0.5
STALL_S = 2.0


def config(socket_dir: Path, **overrides: Any) -> SidecarConfig:
    values: dict[str, Any] = {
        "socket_dir": socket_dir,
        "evidence_dir": None,
        "host": "127.0.0.1",
        "port": 0,
        "poll_interval_s": POLL_S,
        "stall_after_s": STALL_S,
        "request_timeout_s": 5.0,
        "pod": "trainer-worker-0",
        "namespace": "ml",
        "node": "node-a",
    }
    values.update(overrides)
    return SidecarConfig(**values)


@asynccontextmanager
async def running(cfg: SidecarConfig, registry: CollectorRegistry | None = None) -> AsyncIterator[Sidecar]:
    sidecar = Sidecar(cfg, registry if registry is not None else CollectorRegistry())
    await sidecar.start()
    try:
        yield sidecar
    finally:
        await sidecar.stop()


async def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.1) -> float:
    """Await until `predicate()` holds; returns the time.time() it first held. AssertionError on timeout."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(step_s)
    return time.time()


async def wait_async(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, step_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(step_s)


def url(sidecar: Sidecar, path: str) -> str:
    return f"http://127.0.0.1:{sidecar.port}{path}"


async def get(
    sidecar: Sidecar, path: str, token: str | None = None, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    """GET without transparent decompression: the raw bytes and headers as sent."""
    hdrs = dict(headers)
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.get(url(sidecar, path), headers=hdrs, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            return resp.status, dict(resp.headers), await resp.read()


def decode(headers: dict[str, str], body: bytes) -> Any:
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return json.loads(body)


def rank_dumps(snapshot: dict[str, Any]) -> dict[int, RankDump]:
    """What the operator does with a snapshot body: one RankDump per frscope snapshot."""
    out = {}
    for piece in snapshot["ranks"]:
        dump = normalize_dump(piece, piece["source"], piece["rank"])
        out[dump.rank] = dump
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tool(name: str) -> str | None:
    return shutil.which(name)
