"""Faults and bad input: a rank that dies, is wedged, or whose socket vanishes; garbage and oversized
answers; a missing dump dir; a disk that refuses the kept evidence. Each one: a clear log line, the
metrics keep being served, nothing already captured is lost.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from frscope.demo.launcher import LocalJob, start_job
from tests.integration.test_sidecar_support import config, decode, get, running, wait_until

WORLD = 3
REAL_PICKLES = Path(__file__).resolve().parents[1] / "data" / "real" / "hang-pickle"


def wait_for_sockets(job: LocalJob) -> None:
    deadline = time.monotonic() + 90
    while not all(job.socket_path(r).exists() for r in job.ranks()):
        assert all(job.alive(r) for r in job.ranks()), {r: job.log_tail(r) for r in job.ranks()}
        assert time.monotonic() < deadline, "the job's sockets never appeared"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def hung() -> Iterator[LocalJob]:
    with start_job("hang", WORLD, lifetime_s=300) as job:
        wait_for_sockets(job)
        yield job


@asynccontextmanager
async def operator_receiver() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """Stands in for the operator's push endpoint (another component): records what arrives."""
    received: list[dict[str, Any]] = []

    async def push(request: web.Request) -> web.Response:
        assert request.headers.get("Content-Encoding") == "gzip"
        raw = await request.read()  # aiohttp's server undoes Content-Encoding: gzip itself
        body = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        received.append({"headers": dict(request.headers), "body": body})
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/push", push)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        await runner.cleanup()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


@pytest.mark.torch
@pytest.mark.timeout(180)
async def test_rank_dies_wedges_and_loses_its_socket(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    token_file = tmp_path / "token"
    token_file.write_text("push-token")
    with start_job("hang", WORLD, lifetime_s=150) as job:
        wait_for_sockets(job)
        async with operator_receiver() as (operator_url, pushed):
            cfg = config(job.work_dir, operator_url=operator_url, token_file=token_file, push_backoff_s=0.2)
            with caplog.at_level(logging.INFO, logger="frscope.sidecar"):
                async with running(cfg, registry) as sidecar:
                    await wait_until(lambda: sidecar.current_capture() is not None, 60, "a stall capture")
                    await wait_until(lambda: [p["body"]["reason"] for p in pushed] == ["stall"], 20, "stall push")
                    stall_push = pushed[0]
                    assert stall_push["headers"]["X-Frscope-Pod"] == "trainer-worker-0"
                    assert stall_push["headers"]["X-Frscope-Namespace"] == "ml"
                    assert stall_push["headers"]["Authorization"] == "Bearer push-token"
                    assert [p["rank"] for p in stall_push["body"]["ranks"]] == [0, 1, 2]

                    # Wedged: rank 1's process is stopped (its worker server with it) -> timeouts.
                    os.kill(job.procs[1].pid, signal.SIGSTOP)
                    try:
                        await wait_until(lambda: value(registry, "frscope_poll_errors_total", rank="1",
                                                       reason="timeout") >= 1, 30, "a timeout on rank 1")
                        assert value(registry, "frscope_worker_up", rank="1") == 0
                    finally:
                        os.kill(job.procs[1].pid, signal.SIGCONT)
                    await wait_until(lambda: value(registry, "frscope_worker_up", rank="1") == 1, 30, "rank 1 back")

                    # Dies: rank 2 is killed; its socket file stays, nobody listens.
                    job.procs[2].kill()
                    job.procs[2].wait(timeout=10)
                    await wait_until(lambda: value(registry, "frscope_poll_errors_total", rank="2",
                                                   reason="connect") >= 1, 30, "connection refused on rank 2")
                    assert value(registry, "frscope_worker_up", rank="2") == 0
                    await wait_until(lambda: "exit" in [p["body"]["reason"] for p in pushed], 20, "exit push")

                    # Vanishes: rank 0's socket file is removed while the rank lives.
                    job.socket_path(0).unlink()
                    await wait_until(lambda: value(registry, "frscope_poll_errors_total", rank="0",
                                                   reason="no_socket") >= 1, 30, "rank 0's socket gone")
                    assert value(registry, "frscope_worker_up", rank="0") == 0

                    # Metrics still served; the capture still holds every rank, stacks included.
                    status, _h, body = await get(sidecar, "/metrics", token="push-token",
                                                 **{"Accept-Encoding": "identity"})
                    assert status == 200 and b"frscope_worker_up" in body
                    status, headers, body = await get(sidecar, "/v1/snapshot", token="push-token")
                    snap = decode(headers, body)
                    assert snap["reason"] == "stall"
                    assert [p["rank"] for p in snap["ranks"]] == [0, 1, 2]
                    assert "load_batch" in snap["ranks"][1]["stacks"]
                    errors = {e["rank"]: e["message"] for e in snap["errors"]}
                    assert "cannot connect" in errors[2] and "gone" in errors[0]
                    status, headers, body = await get(sidecar, "/v1/status", token="push-token")
                    st = decode(headers, body)
                    assert st["ranks"]["2"]["up"] is False and "cannot connect" in st["ranks"]["2"]["error"]
                    assert st["ranks"]["1"]["up"] is True
    text = caplog.text
    assert "rank 1: " in text and "no answer within" in text
    assert "rank 2: " in text and "cannot connect" in text and "its last good recorder" in text
    assert f"socket {job.socket_path(0)} is gone" in text


class FakeWorker:
    """A unix-socket server standing in for torch's worker server, ONLY to produce answers real torch
    cannot: garbage bodies, non-objects, oversized bodies, bytes that are not HTTP."""

    def __init__(self, path: Path, mode: str) -> None:
        self.path, self.mode = path, mode
        self.runner: web.AppRunner | None = None
        self.raw: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        if self.mode == "not-http":
            async def junk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await reader.read(100)
                writer.write(b"\x00\xff\xfeSSH-2.0-nothing to see\r\n\r\n")
                await writer.drain()
                writer.close()

            self.raw = await asyncio.start_unix_server(junk, path=str(self.path))
            return

        async def handler(request: web.Request) -> web.StreamResponse:
            if self.mode == "garbage":
                return web.Response(body=b"\x89PNG this is not JSON", content_type="application/json")
            if self.mode == "not-a-dump":
                return web.json_response([1, 2, 3])
            if self.mode == "oversized":
                return web.Response(body=b"{" + b" " * (2 * 1024 * 1024) + b"}")
            # oversized-chunked: no Content-Length, the cap must hold while streaming
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for _ in range(64):
                await resp.write(b" " * 65536)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_post("/handler/{name}", handler)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.UnixSite(self.runner, str(self.path)).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.raw is not None:
            self.raw.close()
            await self.raw.wait_closed()


async def test_garbage_and_oversized_answers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Fake worker servers (see FakeWorker) for answers real torch never gives; each fails its own rank
    with a bounded `reason`, and the sidecar keeps polling and serving."""
    sockets = tmp_path / "s"
    sockets.mkdir()
    modes = {5: "garbage", 6: "not-a-dump", 7: "oversized", 8: "oversized-chunked", 9: "not-http"}
    reasons = {5: "decode", 6: "malformed", 7: "oversized", 8: "oversized", 9: "protocol"}
    fakes = [FakeWorker(sockets / f"rank-{r}.sock", m) for r, m in modes.items()]
    for fake in fakes:
        await fake.start()
    registry = CollectorRegistry()
    try:
        with caplog.at_level(logging.WARNING, logger="frscope.sidecar"):
            async with running(config(sockets, max_answer_bytes=1024 * 1024, poll_interval_s=0.2), registry) as sc:
                await wait_until(lambda: value(registry, "frscope_polls_total") >= 3, 30, "three poll rounds")
                for rank, reason in reasons.items():
                    assert value(registry, "frscope_poll_errors_total", rank=str(rank), reason=reason) >= 3, rank
                    assert value(registry, "frscope_worker_up", rank=str(rank)) == 0
                status, _h, body = await get(sc, "/metrics", **{"Accept-Encoding": "identity"})
                assert status == 200
                families = {f.name for f in text_string_to_metric_families(body.decode())}
                assert "frscope_poll_errors" in families
                status, headers, body = await get(sc, "/v1/status")
                st = decode(headers, body)
                assert {r: st["ranks"][str(r)]["up"] for r in modes} == dict.fromkeys(modes, False)
                assert "exceeds the cap" in st["ranks"]["7"]["error"]
                assert "not JSON" in st["ranks"]["5"]["error"]
                assert (await get(sc, "/readyz"))[0] == 200
    finally:
        for fake in fakes:
            await fake.stop()
    # One log line per rank and reason, not one per poll.
    for rank in modes:
        assert sum(f"rank {rank}: " in m for m in caplog.messages) == 1, (rank, caplog.messages)


async def test_missing_dirs_then_a_dump_arrives(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No socket dir and no dump dir (nor its parent) yet: logged once each, everything is served;
    when the dump dir appears, a real torch pickle dropped into it is picked up."""
    registry = CollectorRegistry()
    dump_dir = tmp_path / "volume" / "dumps"
    cfg = config(tmp_path / "no-sockets", dump_dir=dump_dir, dump_settle_s=0.2, dump_scan_interval_s=0.1)
    with caplog.at_level(logging.INFO, logger="frscope.sidecar"):
        async with running(cfg, registry) as sidecar:
            await wait_until(lambda: sidecar.ready and value(registry, "frscope_polls_total") >= 2, 20, "two polls")
            for path in ("/healthz", "/readyz", "/metrics", "/v1/status", "/v1/snapshot"):
                assert (await get(sidecar, path))[0] == 200, path
            status, headers, body = await get(sidecar, "/v1/status")
            assert decode(headers, body)["dump_dir"]["exists"] is False
            dump_dir.mkdir(parents=True)
            src = REAL_PICKLES / "nccl_trace_rank_3"
            (dump_dir / src.name).write_bytes(src.read_bytes())
            await wait_until(lambda: value(registry, "frscope_dumps_collected_total", kind="dump_file") == 1, 20,
                             "the dump file to be collected")
            status, headers, body = await get(sidecar, "/v1/snapshot")
            snap = decode(headers, body)
            assert [(p["rank"], p["source"]) for p in snap["ranks"]] == [(3, f"file:{dump_dir / src.name}")]
    assert caplog.text.count("does not exist") == 2  # the socket dir and the dump dir, once each
    assert "is there now" in caplog.text


def _limit_file_size() -> None:
    # Any regular file this process writes fails past 1 KiB: write() returns EFBIG (SIGXFSZ ignored).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_full_disk_keeps_captures_and_sigterm_shuts_down_cleanly(hung: LocalJob, tmp_path: Path) -> None:
    """A disk that refuses the evidence. No small tmpfs can be mounted here (no CAP_SYS_ADMIN), and
    root ignores directory permissions, so the sidecar runs as a real process under RLIMIT_FSIZE:
    the kernel cuts its capture file short and fails the write (EFBIG), the way a full disk does
    (ENOSPC). The capture it could not write stays in memory and is served; the capture kept on disk
    before is untouched; no partial file is left; the metrics keep being served. Then SIGTERM: a
    clean exit, status 0."""
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    earlier = evidence / "capture-1796000000000000000-stall.json.gz"
    earlier.write_bytes(gzip.compress(b'{"schema": "frscope.sidecar.snapshot/v1", "ranks": []}' + b" " * 5000))
    before = earlier.read_bytes()
    port_file = tmp_path / "port"
    cmd = [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(hung.work_dir),
           "--evidence-dir", str(evidence), "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
           "--poll-interval", "0.5", "--stall-after", "2"]
    # Logs go to a pipe: a log file would be cut at 1 KiB as well.
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_limit_file_size)
    text = ""
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None, proc.communicate(timeout=10)[1].decode()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        port = int(port_file.read_text())

        def fetch(path: str) -> tuple[int, bytes]:
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
                return resp.status, resp.read()

        def metric(text: str, name: str) -> float | None:
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == name:
                        return s.value
            return None

        while True:
            status, body = fetch("/metrics")
            if metric(body.decode(), "frscope_evidence_write_errors_total"):
                break
            assert time.monotonic() < deadline, body.decode()[-2000:]
            time.sleep(0.3)
        assert status == 200
        status, body = fetch("/v1/snapshot")
        snap = json.loads(body)
        assert snap["reason"] == "stall" and "load_batch" in snap["ranks"][1]["stacks"]
        status, body = fetch("/v1/status")
        assert "EFBIG" in json.loads(body)["evidence"]["last_error"]
        assert earlier.read_bytes() == before
        assert sorted(p.name for p in evidence.iterdir()) == [earlier.name]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate(timeout=10)
        text = err.decode()
    assert proc.returncode == 0, text[-3000:]
    assert "evidence: cannot write" in text and "EFBIG" in text and "kept in memory" in text
    assert "shutting down" in text and "frscope sidecar stopped" in text
    assert "Traceback" not in text


@pytest.mark.torch
@pytest.mark.timeout(180)
async def test_a_rank_that_ended_just_before_shutdown_is_pushed_at_shutdown() -> None:
    """The pod ends right after its trainer does: the kubelet stops the sidecar, often before its next
    poll round would have seen the rank go, and the pod's address goes with it. The sidecar's shutdown
    runs a last round, which pushes the rank's end with its last good recorder before the sidecar exits."""
    with start_job("hang", WORLD, lifetime_s=150) as job:
        wait_for_sockets(job)
        async with operator_receiver() as (operator_url, pushed):
            cfg = config(job.work_dir, operator_url=operator_url, poll_interval_s=60.0, push_backoff_s=0.2)
            async with running(cfg) as sidecar:
                await wait_until(lambda: all(s.up for s in sidecar.ranks.values()) and len(sidecar.ranks) == WORLD,
                                 60, "every rank found by the first round")
                job.procs[2].kill()
                job.procs[2].wait(timeout=10)
                assert pushed == []  # the next round is a minute away
            # stopped: the last round saw rank 2 go and its push went out before the sidecar exited
            exits = [p["body"] for p in pushed if p["body"]["reason"] == "exit"]
            assert exits, [p["body"]["reason"] for p in pushed]
            errors = {e["rank"]: e["message"] for e in exits[-1]["errors"]}
            assert 2 in errors, errors
            assert [p["rank"] for p in exits[-1]["ranks"]] == [0, 1, 2]  # rank 2's last good recorder kept
