"""The sidecar's HTTP surface with no rank to poll (the rank-facing behaviour is tested against real
torch jobs in tests/integration/test_sidecar_*.py): probes, auth, metrics, empty answers, push."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from frscope import __version__
from frscope.sidecar.app import Sidecar
from frscope.sidecar.config import SidecarConfig
from frscope.sidecar.main import serve
from frscope.sidecar.metrics import SidecarMetrics
from frscope.sidecar.push import MAX_RETRY_AFTER_S, Pusher, retry_after


def cfg(tmp_path: Path, **kw: Any) -> SidecarConfig:
    base: dict[str, Any] = {
        "socket_dir": tmp_path / "s",
        "evidence_dir": None,
        "host": "127.0.0.1",
        "port": 0,
        "poll_interval_s": 0.1,
        "pod": "p",
        "namespace": "ns",
        "node": "n",
    }
    base.update(kw)
    return SidecarConfig(**base)


async def fetch(sidecar: Sidecar, path: str, **headers: str) -> tuple[int, bytes, CIMultiDict[str]]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{sidecar.port}{path}", headers=headers) as resp:
            return resp.status, await resp.read(), CIMultiDict(resp.headers)


async def test_empty_sidecar_serves_everything(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    sidecar = Sidecar(cfg(tmp_path, poll_interval_s=3600), registry)
    await sidecar.start()
    try:
        assert (await fetch(sidecar, "/healthz"))[:2] == (200, b'{"ok": true}')
        # The first poll round runs as the poll loop starts; /readyz follows it.
        for _ in range(50):
            if sidecar.ready:
                break
            await asyncio.sleep(0.05)
        status, body, _ = await fetch(sidecar, "/readyz")
        assert status == 200 and json.loads(body) == {"ready": True, "ranks": 0}
        status, body, headers = await fetch(sidecar, "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert f'frscope_sidecar_info{{version="{__version__}"}} 1.0' in body.decode()
        assert registry.get_sample_value("frscope_polls_total") == 1
        asked = time.time_ns()
        status, body, _ = await fetch(sidecar, "/v1/status")
        st = json.loads(body)
        assert st["schema"] == "frscope.sidecar.status/v1" and st["ranks"] == {} and st["stalled"] is False
        assert asked <= st["answered_at_ns"] <= time.time_ns()  # its clock when it answered
        assert (st["pod"], st["namespace"], st["node"]) == ("p", "ns", "n")
        status, body, _ = await fetch(sidecar, "/v1/snapshot")
        snap = json.loads(body)
        assert snap["schema"] == "frscope.sidecar.snapshot/v1" and snap["ranks"] == [] and snap["errors"] == []
        assert snap["reason"] == "poll"
    finally:
        await sidecar.stop()


async def test_not_ready_before_the_first_poll(tmp_path: Path) -> None:
    sidecar = Sidecar(cfg(tmp_path))
    app = sidecar.build_app()
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sidecar.port = runner.addresses[0][1]
    try:
        assert (await fetch(sidecar, "/readyz"))[0] == 503
    finally:
        await runner.cleanup()


async def test_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("  t0ken\n")
    sidecar = Sidecar(cfg(tmp_path, token_file=token))
    await sidecar.start()
    try:
        assert (await fetch(sidecar, "/healthz"))[0] == 200
        assert (await fetch(sidecar, "/metrics"))[0] == 401
        status, _, headers = await fetch(sidecar, "/v1/status", Authorization="Bearer nope")
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
        assert (await fetch(sidecar, "/v1/status", Authorization="Bearer t0ken"))[0] == 200
        assert (await fetch(sidecar, "/v1/status", Authorization="bearer t0ken"))[0] == 200
    finally:
        await sidecar.stop()


async def test_unreadable_token_file_is_a_usage_error(tmp_path: Path) -> None:
    stop = asyncio.Event()
    code = await serve(cfg(tmp_path, token_file=tmp_path / "missing"), CollectorRegistry(), stop)
    assert code == 2
    (tmp_path / "empty").write_text("\n")
    assert await serve(cfg(tmp_path, token_file=tmp_path / "empty"), CollectorRegistry(), stop) == 2


async def test_serve_stops_on_the_event(tmp_path: Path) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(serve(cfg(tmp_path), CollectorRegistry(), stop))
    await asyncio.sleep(0.3)
    stop.set()
    assert await asyncio.wait_for(task, 10) == 0


@asynccontextmanager
async def receiver(answers: list[int], headers: dict[str, str] | None = None,
                   ) -> AsyncIterator[tuple[str, list[bytes]]]:
    got: list[bytes] = []

    async def push(request: web.Request) -> web.Response:
        got.append(await request.read())
        status = answers.pop(0) if answers else 200
        return web.Response(status=status, headers=headers if status >= 400 else None)

    app = web.Application()
    app.router.add_post("/v1/push", push)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", got
    finally:
        await runner.cleanup()


def pusher(url: str, registry: CollectorRegistry, attempts: int = 3) -> Pusher:
    return Pusher(
        url,
        token=lambda: "tok",
        pod="p",
        namespace="ns",
        timeout_s=5,
        attempts=attempts,
        backoff_s=0.01,
        metrics=SidecarMetrics(registry),
    )


async def test_push_retries_then_delivers(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    async with receiver([503, 500]) as (url, got):
        p = pusher(url + "/", registry)
        task = asyncio.create_task(p.run())
        p.submit("stall", gzip.compress(b'{"reason": "stall"}'))
        await p.drain(10)
        task.cancel()
    assert len(got) == 3 and json.loads(got[-1]) == {"reason": "stall"}
    assert registry.get_sample_value("frscope_pushes_total", {"result": "retry"}) == 2
    assert registry.get_sample_value("frscope_pushes_total", {"result": "ok"}) == 1
    assert p.delivered == ["stall"]


async def test_push_refused_is_not_retried_and_a_full_queue_drops_the_oldest(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    async with receiver([403]) as (url, got):
        p = pusher(url, registry)
        for reason in ("a", "b", "c", "d", "e"):
            p.submit(reason, gzip.compress(json.dumps({"reason": reason}).encode()))
        task = asyncio.create_task(p.run())
        await p.drain(10)
        task.cancel()
    assert [json.loads(b)["reason"] for b in got] == ["b", "c", "d", "e"]
    assert registry.get_sample_value("frscope_pushes_total", {"result": "dropped"}) == 1
    assert registry.get_sample_value("frscope_pushes_total", {"result": "failed"}) == 1
    assert registry.get_sample_value("frscope_pushes_total", {"result": "retry"}) == 0


@pytest.mark.parametrize("path", ["/v1/status", "/v1/snapshot"])
async def test_gzip_only_when_asked(tmp_path: Path, path: str) -> None:
    sidecar = Sidecar(cfg(tmp_path, poll_interval_s=3600))
    await sidecar.start()
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            url = f"http://127.0.0.1:{sidecar.port}{path}"
            async with session.get(url, headers={"Accept-Encoding": "identity"}) as resp:
                assert "Content-Encoding" not in resp.headers
                json.loads(await resp.read())
            async with session.get(url, headers={"Accept-Encoding": "gzip"}) as resp:
                if path == "/v1/snapshot":
                    assert resp.headers["Content-Encoding"] == "gzip"
                    json.loads(gzip.decompress(await resp.read()))
    finally:
        await sidecar.stop()


def test_snapshot_window_keeps_thenewest_entries() -> None:
    import zlib

    from frscope.sidecar.snapshot import newest_entries

    piece = {
        "frscope_snapshot": 1,
        "rank": 3,
        "trace": {"version": "2.10", "entries": [{"record_id": i} for i in range(10)]},
    }
    out = json.loads(zlib.decompress(newest_entries(zlib.compress(json.dumps(piece).encode()), 4)))
    assert [e["record_id"] for e in out["trace"]["entries"]] == [6, 7, 8, 9]
    assert out["entries_dropped"] == 6 and out["rank"] == 3
    short = zlib.compress(json.dumps(piece).encode())
    assert newest_entries(short, 50) is short


async def test_snapshot_window_must_be_positive(tmp_path: Path) -> None:
    sidecar = Sidecar(cfg(tmp_path, poll_interval_s=3600))
    await sidecar.start()
    try:
        assert (await fetch(sidecar, "/v1/snapshot?entries=0"))[0] == 400
        assert (await fetch(sidecar, "/v1/snapshot?entries=x"))[0] == 400
        status, body, _ = await fetch(sidecar, "/v1/snapshot?entries=1000001")
        assert status == 400 and b"from 1 to 1,000,000" in body
        assert (await fetch(sidecar, "/v1/snapshot?entries=1000000"))[0] == 200
        status, body, _ = await fetch(sidecar, "/v1/snapshot?entries=200")
        assert status == 200 and json.loads(body)["ranks"] == []
    finally:
        await sidecar.stop()


@pytest.mark.parametrize(("header", "seconds"), [("3", 3.0), ("0.5", 0.5), ("-4", 0.0), ("nan", 0.0),
                                                 ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), (None, 0.0),
                                                 ("100000", MAX_RETRY_AFTER_S)])
def test_retry_after_header_is_read_bounded(header: str | None, seconds: float) -> None:
    assert retry_after(header) == seconds


async def test_a_429_is_retried_after_the_delay_the_operator_asks(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="frscope.sidecar")
    registry = CollectorRegistry()
    async with receiver([429], headers={"Retry-After": "1"}) as (url, got):
        p = pusher(url, registry)  # its own backoff is 0.01 s
        task = asyncio.create_task(p.run())
        p.submit("stall", gzip.compress(b'{"reason": "stall"}'))
        await p.drain(10)
        task.cancel()
    assert len(got) == 2 and p.delivered == ["stall"]
    assert "the operator is busy (HTTP 429); retry in 1.0 s" in caplog.text


async def test_waits_a_busy_operator_asks_for_are_no_failed_tries() -> None:
    """A push storm: the operator answers 429 with Retry-After to most pushes for a while. Those waits
    do not use up the push's tries (3 here), so the evidence still gets in."""
    registry = CollectorRegistry()
    async with receiver([429] * 8, headers={"Retry-After": "0.05"}) as (url, got):
        p = pusher(url, registry)
        task = asyncio.create_task(p.run())
        p.submit("stall", gzip.compress(b'{"reason": "stall"}'))
        await p.drain(20)
        task.cancel()
    assert len(got) == 9 and p.delivered == ["stall"]
    assert not registry.get_sample_value("frscope_pushes_total", {"result": "failed"})


async def test_waiting_on_a_busy_operator_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import frscope.sidecar.push as push

    monkeypatch.setattr(push, "MAX_THROTTLED_S", 0.3)
    registry = CollectorRegistry()
    async with receiver([429] * 100, headers={"Retry-After": "0.1"}) as (url, got):
        p = pusher(url, registry)
        task = asyncio.create_task(p.run())
        p.submit("stall", gzip.compress(b'{"reason": "stall"}'))
        await p.drain(20)
        task.cancel()
    # about 0.3 s of asked waits, then the 3 tries: far fewer than the 100 refusals on offer
    assert 4 <= len(got) <= 8 and p.delivered == []
    assert registry.get_sample_value("frscope_pushes_total", {"result": "failed"}) == 1


async def test_snapshot_answers_not_modified_to_its_etag_until_what_it_serves_changes(tmp_path: Path) -> None:
    """`/v1/snapshot`'s ETag names what the answer holds (the window, the coding, each rank's evidence): an
    If-None-Match naming it gets 304 and no body, until a rank's next full fetch or its stacks change it.
    A long If-None-Match, or one of too many tags, is not read: the answer is sent whole."""
    import zlib

    from frscope.sidecar.client import WorkerClient
    from frscope.sidecar.ranks import RankState

    sidecar = Sidecar(cfg(tmp_path, poll_interval_s=3600))
    await sidecar.start()
    try:
        for _ in range(50):  # the first round (no ranks): the next is an hour away
            if sidecar.ready:
                break
            await asyncio.sleep(0.05)
        path = "/v1/snapshot?entries=8"
        gz, plain = {"Accept-Encoding": "gzip"}, {"Accept-Encoding": "identity"}
        status, _, headers = await fetch(sidecar, path, **gz)
        etag = headers["ETag"]
        assert status == 200 and etag.startswith('W/"') and etag.endswith('-gzip"')
        assert (await fetch(sidecar, path, **plain))[2]["ETag"] not in (etag, "")
        for asked in (etag, etag.removeprefix("W/"), f'"other", {etag}', "*"):
            status, body, headers = await fetch(sidecar, path, **gz, **{"If-None-Match": asked})
            assert (status, body, headers["ETag"]) == (304, b"", etag)
        many = ", ".join(['"x"'] * 8 + [etag])
        for asked in ('"other"', etag + ", " + '"y", ' * 300 + '"z"', many):
            assert (await fetch(sidecar, path, **gz, **{"If-None-Match": asked}))[0] == 200
        assert (await fetch(sidecar, "/v1/snapshot?entries=9", **gz, **{"If-None-Match": etag}))[0] == 200
        assert (await fetch(sidecar, path, **plain, **{"If-None-Match": etag}))[0] == 200

        # a rank's full fetch (a real gloo rank's recorder, as the poller keeps it)
        trace = json.loads((Path(__file__).parents[2] / "data/real/straggler/rank-0.json").read_text())["trace"]
        endpoint = tmp_path / "s" / "rank-0.sock"
        state = RankState(0, endpoint, WorkerClient(endpoint, timeout_s=1, max_bytes=1 << 20), up=True,
                          raw_ns=time.time_ns(), raw_z=zlib.compress(json.dumps(trace).encode()))
        sidecar.poller.ranks[0] = state
        status, body, headers = await fetch(sidecar, path, **gz, **{"If-None-Match": etag})
        assert status == 200 and [r["rank"] for r in json.loads(body)["ranks"]] == [0]
        with_rank = headers["ETag"]
        assert (await fetch(sidecar, path, **gz, **{"If-None-Match": with_rank}))[0] == 304
        state.stacks, state.stacks_for_ns = "Thread 1 (most recent call first):\n", state.raw_ns
        status, body, headers = await fetch(sidecar, path, **gz, **{"If-None-Match": with_rank})
        assert status == 200 and json.loads(body)["ranks"][0]["stacks"].startswith("Thread 1")
        with_stacks = headers["ETag"]
        assert (await fetch(sidecar, path, **gz, **{"If-None-Match": with_stacks}))[0] == 304
        state.raw_ns += 1  # the next full fetch (its stacks are of the one before: not served)
        status, body, headers = await fetch(sidecar, path, **gz, **{"If-None-Match": with_stacks})
        assert status == 200 and headers["ETag"] not in (etag, with_rank, with_stacks)
        assert json.loads(body)["ranks"][0]["stacks"] is None
    finally:
        await sidecar.stop()
