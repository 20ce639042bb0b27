"""A push storm is taken in a few at a time: the excess is answered 429 before its body is read, with a
Retry-After spread over the backlog (so the retries do not come back as one second storm)."""

from __future__ import annotations

import gzip
import json
import random

import aiohttp
from prometheus_client import CollectorRegistry

from frscope.operator.model.objects import JobKey
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.serve.operator_http import Health, OperatorHttp
from frscope.operator.serve.push_gate import MAX_RETRY_AFTER_S, PushGate
from tests.unit.operator.fakes import StandInSidecar


def test_past_the_limit_a_push_is_refused_with_a_spread_retry_after() -> None:
    now = [0.0]
    gate = PushGate(2, window_s=10.0, decode_s=1.0, clock=lambda: now[0], rng=random.Random(7))
    assert gate.try_enter() is None and gate.try_enter() is None
    waits = [gate.try_enter() for _ in range(200)]
    assert all(w is not None and 1 <= w <= MAX_RETRY_AFTER_S for w in waits)
    # 200 refusals of 1 s decodes: the retries are spread over the backlog, not all told "1 s"
    late = [w for w in waits[100:] if w is not None]
    assert len(set(late)) > 20 and max(late) > 50
    gate.leave(1.0)
    assert gate.try_enter() is None  # a slot freed: the next push is taken
    now[0] = 60.0  # the storm is over: old refusals no longer count
    gate.leave(1.0)
    gate.leave(1.0)
    assert gate.in_flight == 0 and gate.try_enter() is None


async def test_a_storm_over_http_is_taken_a_few_at_a_time(hang_ranks: dict[int, dict[str, object]]) -> None:
    """Real HTTP on loopback: while two pushes are being taken in (their slots held, as two slow decodes
    would), the third is answered 429 with Retry-After at once; once one finishes, the next is accepted."""
    http = OperatorHttp(registry=CollectorRegistry(), metrics=OperatorMetrics(CollectorRegistry()),
                        health=Health(max_silence_s=60), on_push=lambda e: JobKey("ml", "train"),
                        gate=PushGate(2))
    gate = http._gate
    assert gate.try_enter() is None and gate.try_enter() is None
    port = await http.start("127.0.0.1", 0)
    body = gzip.compress(json.dumps(StandInSidecar("train-worker-0", {0: hang_ranks[0]}).snapshot_obj()
                                    | {"reason": "stall"}).encode())
    headers = {"Content-Encoding": "gzip", "X-Frscope-Pod": "train-worker-0", "X-Frscope-Namespace": "ml"}
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{port}/v1/push", data=body, headers=headers) as r:
                assert r.status == 429 and 1 <= int(r.headers["Retry-After"]) <= MAX_RETRY_AFTER_S
            gate.leave(0.1)
            async with s.post(f"http://127.0.0.1:{port}/v1/push", data=body, headers=headers) as r:
                assert r.status == 202, await r.text()
    finally:
        await http.stop()
    assert gate.in_flight == 1  # the slot still held by the test; the accepted push left its own
