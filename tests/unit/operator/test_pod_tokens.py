"""`PodTokens`: one TokenRequest per pod while its token is fresh, for that pod's audience only. The
TokenRequest endpoint is a loopback aiohttp stand-in that records what it is asked (the real API
server's answers, and the sidecar's check of them, are in tests/e2e/test_tenants_e2e.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from frscope.operator.kube import KubeClient
from frscope.operator.kube.pod_tokens import PodTokens, parse_identity
from frscope.wire import sidecar_audience

PATH = "/api/v1/namespaces/frscope/serviceaccounts/frscope-operator/token"


class TokenApi:
    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.delay_s = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.asked.append(body)
        await asyncio.sleep(self.delay_s)
        audience = body["spec"]["audiences"][0]
        return web.json_response({"status": {"token": f"token-{len(self.asked)}-{audience}",
                                             "expirationTimestamp": "2099-01-01T00:00:00Z"}}, status=201)


@pytest.fixture
async def api() -> AsyncIterator[tuple[TokenApi, str]]:
    served = TokenApi()
    app = web.Application()
    app.router.add_post(PATH, served.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield served, str(server.make_url("")).rstrip("/")
    await server.close()


async def test_one_request_per_pod_while_fresh_for_that_pods_audience(api: tuple[TokenApi, str]) -> None:
    served, url = api
    served.delay_s = 0.1
    async with aiohttp.ClientSession() as session:
        tokens = PodTokens(KubeClient(session, url), "system:serviceaccount:frscope:frscope-operator",
                           lifetime_s=60)
        first = await asyncio.gather(*(tokens.token("ml", "train-worker-0") for _ in range(10)))
        assert len(set(first)) == 1 and len(served.asked) == 1  # concurrent asks share one request
        assert served.asked[0]["spec"] == {"audiences": [sidecar_audience("ml", "train-worker-0")],
                                           "expirationSeconds": 600}  # the API server's minimum
        assert await tokens.token("ml", "train-worker-0") == first[0]  # cached
        other = await tokens.token("ml", "train-worker-1")
        assert other != first[0] and sidecar_audience("ml", "train-worker-1") in other
        tokens.forget("ml", "train-worker-0")
        assert await tokens.token("ml", "train-worker-0") != first[0]
        assert len(served.asked) == 3 and tokens.minted == 3


def test_the_identity_must_be_a_service_account() -> None:
    assert parse_identity("system:serviceaccount:frscope:op") == ("frscope", "op")
    for wrong in ("frscope:op", "system:serviceaccount::op", "user@example.com"):
        with pytest.raises(ValueError):
            parse_identity(wrong)
