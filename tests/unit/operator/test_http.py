"""The operator's HTTP server on loopback: probes, metrics, the push receiver, the route seam."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.evidence.push_store import Full
from frscope.operator.kube import StaticToken
from frscope.operator.model.objects import JobKey
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.serve.access import SharedTokenPush
from frscope.operator.serve.operator_http import Health, OperatorHttp
from tests.unit.operator.fakes import StandInSidecar


class Server:
    def __init__(self, token: str | None = None, max_push_bytes: int = 1024 * 1024) -> None:
        self.registry = CollectorRegistry()
        self.health = Health(max_silence_s=60)
        self.pushed: list[PodEvidence] = []
        self.http = OperatorHttp(registry=self.registry, metrics=OperatorMetrics(self.registry), health=self.health,
                                 on_push=self.on_push, push_auth=SharedTokenPush(StaticToken(token)) if token else None,
                                 max_push_bytes=max_push_bytes)
        self.url = ""

    def on_push(self, snapshot: PodEvidence) -> JobKey | None:
        self.pushed.append(snapshot)
        return JobKey("ml", "train")


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server(token="s3cret", max_push_bytes=256 * 1024)

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="ui")

    srv.http.add_routes([web.get("/ui/", hello)])  # what frscope/webui will do
    port = await srv.http.start("127.0.0.1", 0)
    srv.url = f"http://127.0.0.1:{port}"
    yield srv
    await srv.http.stop()


def body(ranks: dict[int, Any]) -> bytes:
    return json.dumps(StandInSidecar("train-worker-0", ranks).snapshot_obj() | {"reason": "stall"}).encode()


async def test_probes_metrics_and_added_routes(server: Server) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(server.url + "/healthz") as r:
            assert r.status == 200
        async with s.get(server.url + "/readyz") as r:
            assert r.status == 503  # kopf not started yet
        server.health.ready = True
        async with s.get(server.url + "/readyz") as r:
            assert r.status == 200
        server.health.failed = "kopf stopped"
        async with s.get(server.url + "/healthz") as r:
            assert r.status == 503
        async with s.get(server.url + "/metrics") as r:
            text = await r.text()
            assert 'frscope_operator_diagnoses_total{category="RankNotJoined"} 0.0' in text
        async with s.get(server.url + "/ui/") as r:
            assert await r.text() == "ui"


async def test_push_gzip_with_token(server: Server, hang_ranks: dict[int, Any]) -> None:
    headers = {"Authorization": "Bearer s3cret", "Content-Encoding": "gzip", "Content-Type": "application/json",
               "X-Frscope-Pod": "train-worker-0", "X-Frscope-Namespace": "ml"}
    async with aiohttp.ClientSession() as s:
        async with s.post(server.url + "/v1/push", data=gzip.compress(body(hang_ranks)), headers=headers) as r:
            assert r.status == 202, await r.text()
            assert (await r.json())["job"] == "ml/train"
    [snap] = server.pushed
    assert snap.pod == "train-worker-0" and snap.reason == "stall" and snap.ranks == (0, 1, 2, 3)
    assert server.registry.get_sample_value("frscope_operator_pushes_total", {"result": "accepted"}) == 1


async def test_push_rejections(server: Server, hang_ranks: dict[int, Any]) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(server.url + "/v1/push", data=body(hang_ranks)) as r:
            assert r.status == 401
        auth = {"Authorization": "Bearer s3cret"}
        async with s.post(server.url + "/v1/push", data=b"{not json", headers=auth) as r:
            assert r.status == 400
        async with s.post(server.url + "/v1/push", data=b'{"schema": "x"}', headers=auth) as r:
            assert r.status == 400
        big = json.dumps({"schema": "frscope.sidecar.snapshot/v1", "pad": "x" * 400_000}).encode()
        async with s.post(server.url + "/v1/push", data=big, headers=auth) as r:
            assert r.status == 413
    assert server.pushed == []
    assert server.registry.get_sample_value("frscope_operator_pushes_total", {"result": "rejected"}) == 4


async def test_a_full_store_answers_429_with_retry_after(server: Server) -> None:
    def full(_: PodEvidence) -> JobKey | None:
        raise Full("pushed evidence holds 100 bytes (budget 100)", 42)

    server.http._on_push = full
    async with aiohttp.ClientSession() as s:
        async with s.post(server.url + "/v1/push", data=body({}), headers={"Authorization": "Bearer s3cret"}) as r:
            assert r.status == 429 and r.headers["Retry-After"] == "42"
            assert (await r.json())["retry_after_s"] == 42
    assert server.registry.get_sample_value("frscope_operator_pushes_total", {"result": "throttled"}) == 1
