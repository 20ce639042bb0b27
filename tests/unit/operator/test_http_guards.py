"""Who may read the operator's web UI and `/metrics` without a token (issue 26), through the operator's
real HTTP server and real connections: only what `kubectl port-forward` makes (from 127.0.0.1, `Host`
naming loopback, no proxy headers). A page of another site whose name resolves to 127.0.0.1 (DNS
rebinding), a mesh proxy relaying from 127.0.0.6 (Istio's inbound address; the connection here really
comes from 127.0.0.6) or adding forwarding headers, gets 401. And a client that shows one refused
token after another is rate-limited (429) after `FAILURES_BURST` reviews.

No request here carries a token the API server would accept, so the tests that need no review use a
client to an API server that does not exist; the storm test answers TokenReviews from a loopback
aiohttp stand-in that counts them (the real API server's answers are in tests/e2e/test_tenants_e2e.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from frscope.operator.kube import KubeClient
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.model.store import JobStore
from frscope.operator.serve.access import FAILURES_BURST, KubernetesPush, Reviewer
from frscope.operator.serve.guards import metrics_guard
from frscope.operator.serve.operator_http import Health, OperatorHttp
from frscope.operator.serve.ui import mount_ui, ui_guard


class Rig:
    def __init__(self, reviewer: Reviewer) -> None:
        registry = CollectorRegistry()
        self.reviewer = reviewer
        self.http = OperatorHttp(registry=registry, metrics=OperatorMetrics(registry), health=Health(),
                                 on_push=lambda evidence: None, push_auth=KubernetesPush(reviewer),
                                 metrics_guard=metrics_guard("port-forward", reviewer))
        mount_ui(self.http, JobStore(), guard=ui_guard("port-forward", reviewer))
        self.port = 0

    async def get(self, path: str, *, source: str = "127.0.0.1", **headers: str) -> int:
        connector = aiohttp.TCPConnector(local_addr=(source, 0))
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get(f"http://127.0.0.1:{self.port}{path}", headers=headers) as resp:
                return resp.status


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with aiohttp.ClientSession() as api:
        built = Rig(Reviewer(KubeClient(api, "https://127.0.0.1:1")))  # nothing is reviewed in these tests
        built.port = await built.http.start("127.0.0.1", 0)
        yield built
        await built.http.stop()


@pytest.mark.parametrize("path", ["/ui/api/jobs", "/metrics"])
async def test_only_a_port_forward_connection_is_let_in_without_a_token(rig: Rig, path: str) -> None:
    assert await rig.get(path) == 200  # as kubectl port-forward connects: Host 127.0.0.1:<port>
    assert await rig.get(path, Host="localhost:8080") == 200
    assert await rig.get(path, Host="attacker.example:8080") == 401  # DNS rebinding
    assert await rig.get(path, source="127.0.0.6") == 401  # Istio's inbound proxy
    assert await rig.get(path, **{"X-Forwarded-For": "10.1.2.3"}) == 401  # a proxy in the pod


async def test_an_incident_bundle_is_behind_the_same_guard(rig: Rig) -> None:
    path = "/ui/jobs/ml/train/bundle"
    assert await rig.get(path) == 404  # let in; no such job here
    assert await rig.get(path, Host="attacker.example:8080") == 401
    assert await rig.get(path, **{"X-Forwarded-For": "10.1.2.3"}) == 401


async def test_a_storm_of_refused_tokens_costs_a_bounded_number_of_reviews() -> None:
    reviews: list[Any] = []

    async def token_review(request: web.Request) -> web.Response:
        reviews.append(await request.json())
        return web.json_response({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                  "status": {"authenticated": False}}, status=201)

    app = web.Application()
    app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", token_review)
    api_server = TestServer(app, host="127.0.0.1")
    await api_server.start_server()
    async with aiohttp.ClientSession() as api:
        rig = Rig(Reviewer(KubeClient(api, str(api_server.make_url("")))))
        rig.port = await rig.http.start("127.0.0.1", 0)
        try:
            codes = []
            async with aiohttp.ClientSession() as session:
                for i in range(50):
                    async with session.post(f"http://127.0.0.1:{rig.port}/v1/push", data=b"{}",
                                            headers={"Authorization": f"Bearer bad-token-{i}"}) as resp:
                        codes.append(resp.status)
                        if resp.status == 429:
                            assert int(resp.headers["Retry-After"]) >= 1
            assert len(reviews) == FAILURES_BURST and rig.reviewer.reviews == FAILURES_BURST
            assert codes == [401] * FAILURES_BURST + [429] * (50 - FAILURES_BURST)
        finally:
            await rig.http.stop()
            await api_server.close()
