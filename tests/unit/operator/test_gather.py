"""Gather fan-out against stand-in sidecars on loopback serving REAL recorder snapshots
(tests/data/real/hang: the demo's real hung gloo job). Stand-ins, not the real sidecar: these tests
need sidecars that fail on cue (down, garbage, slow, flaky), which a real one does not do on demand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from frscope.analysis import AnalysisOptions
from frscope.operator.evidence.diagnosis import diagnose_sync
from frscope.operator.evidence.gather import GatherOptions, Target, gather
from frscope.operator.evidence.pod_evidence import from_snapshot
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.settle import take_pushes
from frscope.operator.evidence.sidecars import SidecarClient, parse_snapshot
from tests.unit.operator.fakes import StandInSidecar

Make = Callable[..., Awaitable[StandInSidecar]]
FAST = GatherOptions(per_pod_timeout_s=1.0, overall_timeout_s=3.0, attempts=3, backoff_base_s=0.01)


@pytest.fixture
async def client() -> Any:
    async with aiohttp.ClientSession() as session:
        yield SidecarClient(session)


def split(ranks: dict[int, dict[str, Any]]) -> tuple[dict[int, Any], dict[int, Any]]:
    return {r: v for r, v in ranks.items() if r < 2}, {r: v for r, v in ranks.items() if r >= 2}


async def test_every_pod_gathered_and_analyzed(sidecars: Make, client: SidecarClient,
                                               hang_ranks: dict[int, Any]) -> None:
    a, b = split(hang_ranks)
    s0, s1 = await sidecars("train-master-0", a), await sidecars("train-worker-0", b)
    got = await gather(client, "ml", [Target(s0.pod, s0.endpoint), Target(s1.pod, s1.endpoint)], FAST)
    assert got.failures == {} and set(got.pods) == {"train-master-0", "train-worker-0"}
    diagnosis = diagnose_sync(got, 4, AnalysisOptions(stall_after_s=0.5))
    assert diagnosis.report.findings[0].culprit_ranks == (1,)
    assert diagnosis.report.missing_ranks == ()


async def test_down_garbage_and_no_endpoint_are_named_not_dropped(sidecars: Make, client: SidecarClient,
                                                                  hang_ranks: dict[int, Any]) -> None:
    a, b = split(hang_ranks)
    ok = await sidecars("train-master-0", a)
    down = await sidecars("train-worker-0", b, mode="down")
    garbage = await sidecars("train-worker-1", {}, mode="garbage")
    targets = [Target(ok.pod, ok.endpoint), Target(down.pod, down.endpoint), Target(garbage.pod, garbage.endpoint),
               Target("train-worker-2", None)]
    got = await gather(client, "ml", targets, FAST)
    assert set(got.pods) == {"train-master-0"}
    assert "HTTP 503" in got.failures["train-worker-0"]
    assert "not JSON" in got.failures["train-worker-1"]
    assert "train-worker-0" not in got.pods
    assert "no sidecar endpoint" in got.failures["train-worker-2"]
    assert down.snapshot_requests == 3  # retried (5xx), up to the attempts
    assert garbage.snapshot_requests == 1  # garbage is not retried
    diagnosis = diagnose_sync(got, 4, AnalysisOptions(stall_after_s=0.5))
    assert diagnosis.report.missing_ranks == (2, 3)
    assert any("train-worker-0" in p.source for p in diagnosis.report.problems)


async def test_flaky_sidecar_is_retried(sidecars: Make, client: SidecarClient, hang_ranks: dict[int, Any]) -> None:
    flaky = await sidecars("p", hang_ranks, mode="flaky", flaky_failures=2)
    got = await gather(client, "ml", [Target("p", flaky.endpoint)], FAST)
    assert got.failures == {} and flaky.snapshot_requests == 3


async def test_per_pod_and_overall_deadlines(sidecars: Make, client: SidecarClient, hang_ranks: dict[int, Any]) -> None:
    slow = await sidecars("slow", hang_ranks, mode="slow", delay_s=10)
    fast = await sidecars("fast", hang_ranks)
    options = GatherOptions(per_pod_timeout_s=0.3, overall_timeout_s=5.0, attempts=2, backoff_base_s=0.01)
    started = time.monotonic()
    got = await gather(client, "ml", [Target("slow", slow.endpoint), Target("fast", fast.endpoint)], options)
    assert time.monotonic() - started < 3
    assert "TimeoutError" in got.failures["slow"] and "fast" in got.pods
    overall = GatherOptions(per_pod_timeout_s=30, overall_timeout_s=0.5, attempts=1)
    started = time.monotonic()
    got = await gather(client, "ml", [Target("slow", slow.endpoint)], overall)
    assert time.monotonic() - started < 3
    assert "gather deadline" in got.failures["slow"]


async def test_a_gather_goes_on_while_answers_arrive_up_to_its_limit(sidecars: Make, client: SidecarClient,
                                                                     hang_ranks: dict[int, Any]) -> None:
    # A big job's pods queue behind the concurrency for longer than one deadline: each answer arriving in
    # time keeps the gather going (a pod cut off then would be reported as a rank without evidence).
    a, b = split(hang_ranks)
    pods = [await sidecars(f"p{k}", a if k % 2 else b, mode="slow", delay_s=0.3) for k in range(5)]
    targets = [Target(p.pod, p.endpoint) for p in pods]
    queued = GatherOptions(per_pod_timeout_s=5, overall_timeout_s=0.9, attempts=1, concurrency=1)
    started = time.monotonic()
    got = await gather(client, "ml", targets, queued)
    assert time.monotonic() - started > queued.overall_timeout_s
    assert got.failures == {} and len(got.pods) == 5
    # ... but no longer than its limit in all: the pods still queued then are named.
    limited = GatherOptions(per_pod_timeout_s=5, overall_timeout_s=0.9, limit_s=1.0, attempts=1, concurrency=1)
    got = await gather(client, "ml", targets, limited)
    assert 2 <= len(got.pods) <= 4
    assert all("gather deadline" in why for why in got.failures.values()) and len(got.failures) == 5 - len(got.pods)


async def test_pushed_snapshots_stand_in_for_unreachable_and_deleted_pods(
        sidecars: Make, client: SidecarClient, hang_ranks: dict[int, Any]) -> None:
    a, b = split(hang_ranks)
    down = await sidecars("train-worker-0", b, mode="down")
    ok = await sidecars("train-master-0", {0: a[0]})
    pushes = PushStore()
    pushes.put(from_snapshot(parse_snapshot(down.snapshot_obj(), "push", size_bytes=10), origin="push"))
    gone = parse_snapshot({**ok.snapshot_obj(), "pod": "train-master-1", "ranks": [a[1]]}, "push", size_bytes=10)
    pushes.put(from_snapshot(gone, origin="push"))
    got = await gather(client, "ml", [Target(ok.pod, ok.endpoint), Target(down.pod, down.endpoint)], FAST)
    take_pushes(got, pushes.for_namespace_pods("ml", {ok.pod, down.pod, "train-master-1"}), {})
    assert got.failures == {}
    assert got.from_push == {"train-worker-0", "train-master-1"}
    diagnosis = diagnose_sync(got, 4, AnalysisOptions(stall_after_s=0.5))
    assert diagnosis.report.missing_ranks == () and diagnosis.report.findings[0].culprit_ranks == (1,)


async def test_only_the_newest_entries_are_kept(sidecars: Make, client: SidecarClient,
                                                hang_ranks: dict[int, Any]) -> None:
    s0 = await sidecars("p", hang_ranks)
    options = GatherOptions(per_pod_timeout_s=2, overall_timeout_s=5, max_entries=3)
    got = await gather(client, "ml", [Target("p", s0.endpoint)], options)
    evidence = got.pods["p"]
    assert all(len(d.entries) <= 3 for d in evidence.dumps) and got.entries_dropped > 0
    # The newest entries are the ones that tell the hang: the diagnosis is unchanged.
    diagnosis = diagnose_sync(got, 4, AnalysisOptions(stall_after_s=0.5))
    assert diagnosis.report.findings[0].culprit_ranks == (1,)
    assert any("older entries left out" in p.message for p in diagnosis.report.problems)


@pytest.mark.timeout(60)
async def test_decoding_in_worker_processes(sidecars: Make, client: SidecarClient,
                                            hang_ranks: dict[int, Any]) -> None:
    from frscope.operator.evidence.gather import Decoder

    a, b = split(hang_ranks)
    ok0, ok1 = await sidecars("p0", a), await sidecars("p1", b)
    garbage = await sidecars("p2", {}, mode="wrong-schema")
    decoder = Decoder(processes=1)
    try:
        await decoder.warm_up()
        got = await gather(client, "ml", [Target("p0", ok0.endpoint), Target("p1", ok1.endpoint),
                                          Target("p2", garbage.endpoint)], FAST, decoder=decoder)
    finally:
        decoder.close()
    assert set(got.pods) == {"p0", "p1"} and "not a frscope.sidecar.snapshot/v1" in got.failures["p2"]
    assert garbage.snapshot_requests == 1  # the error came back whole: not retryable
    diagnosis = diagnose_sync(got, 4, AnalysisOptions(stall_after_s=0.5))
    assert diagnosis.report.findings[0].culprit_ranks == (1,)


async def test_gzip_bodies_are_inflated_by_the_decoder_with_a_cap(sidecars: Make, hang_ranks: dict[int, Any]) -> None:
    import gzip as gz

    from frscope.operator.evidence.pod_evidence import from_bytes
    from frscope.operator.evidence.sidecars import SidecarError

    s0 = await sidecars("p0", hang_ranks, mode="gzip")
    async with aiohttp.ClientSession(auto_decompress=False) as session:  # as the operator's session
        raw = await SidecarClient(session).snapshot_bytes(s0.endpoint, 5)
        assert raw[:2] == b"\x1f\x8b"
        got = await gather(SidecarClient(session), "ml", [Target("p0", s0.endpoint)], FAST)
    assert got.pods["p0"].ranks == (0, 1, 2, 3)
    bomb = gz.compress(b"{" + b" " * (300 * 1024 * 1024))
    with pytest.raises(SidecarError, match="larger than"):
        from_bytes(bomb, "x", origin="sidecar")


def _fetches() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__name__", "") == "_fetch_one"]


@pytest.mark.parametrize("twice", [False, True])
async def test_a_cancelled_gather_cancels_its_fetches(sidecars: Make, client: SidecarClient,
                                                      hang_ranks: dict[int, Any], twice: bool) -> None:
    slow = [await sidecars(f"slow-{i}", hang_ranks, mode="slow", delay_s=30) for i in range(3)]
    options = GatherOptions(per_pod_timeout_s=60, overall_timeout_s=120, attempts=1, concurrency=2)
    task = asyncio.create_task(gather(client, "ml", [Target(s.pod, s.endpoint) for s in slow], options))
    for _ in range(200):  # until the first two requests are in flight (the third waits its turn)
        await asyncio.sleep(0.01)
        if sum(s.snapshot_requests for s in slow) == 2:
            break
    assert len(_fetches()) == 3
    started = time.monotonic()
    task.cancel()
    if twice:
        await asyncio.sleep(0)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 5
    assert _fetches() == [], "no fetch outlives its gather"
    assert sum(s.snapshot_requests for s in slow) == 2


async def test_a_pod_whose_address_answers_no_connection_is_given_up_at_the_connect_limit(
        client: SidecarClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod that ended a moment ago, its network gone before the pod watch says so, drops the SYN: the
    request neither fails nor answers. A real listening socket whose accept queue is full does the same on
    loopback. Each attempt gives up at the connect limit, not at the request's whole timeout (30 s)."""
    import socket

    from frscope.operator.evidence import sidecars as sidecars_module

    monkeypatch.setattr(sidecars_module, "CONNECT_TIMEOUT_S", 0.5)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued = []
        for _ in range(4):  # fill the accept queue; nothing ever accepts
            queued.append(sock := socket.socket())
            sock.setblocking(False)
            try:
                sock.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
        await asyncio.sleep(0.2)
        options = GatherOptions(per_pod_timeout_s=30, overall_timeout_s=60, attempts=2, backoff_base_s=0.01)
        started = time.monotonic()
        got = await gather(client, "ml", [Target("ended", f"http://127.0.0.1:{port}")], options)
        elapsed = time.monotonic() - started
        for sock in queued:
            sock.close()
    assert "ended" not in got.pods and "onnection timeout" in got.failures["ended"], got.failures
    assert elapsed < 10, elapsed  # two attempts of 0.5 s each; 60 s with only the request's timeout


def test_decoder_processes_end_when_the_operator_process_is_killed(tmp_path: Path) -> None:
    """An operator SIGKILLed (or OOM-killed) cannot shut its decoder pool down: its worker processes end
    by themselves once their parent is gone, rather than waiting for work forever."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "operator.py"
    script.write_text(
        "import asyncio, os, sys, time\n"
        "from frscope.operator.evidence.gather import Decoder\n"
        "async def main():\n"
        "    decoder = Decoder(processes=2)\n"
        "    await decoder.warm_up()\n"
        "    print(' '.join(str(p) for p in decoder._pool._processes), flush=True)\n"
        "    time.sleep(120)\n"
        "if __name__ == '__main__':\n"
        "    asyncio.run(main())\n")
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                          cwd=Path(__file__).resolve().parents[3]) as proc:
        try:
            assert proc.stdout is not None
            workers = [int(p) for p in proc.stdout.readline().split()]
            assert len(workers) == 2 and all(os.path.exists(f"/proc/{p}") for p in workers)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)

    def alive(pid: int) -> bool:
        try:
            return not Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
        except (FileNotFoundError, IndexError):
            return False

    deadline = time.monotonic() + 20
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in workers if alive(p)]
    for pid in left:  # the test's own leftovers, by PID
        os.kill(pid, signal.SIGKILL)
    assert not left, f"decoder processes {left} outlived the killed operator"
