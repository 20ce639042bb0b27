"""The node ledger's page in the web UI, on a real aiohttp server (loopback)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from frscope.webui import MemoryProvider, NodeIncidentRow, NodeSummary, create_app
from frscope.webui.routes import VISIBLE_NODES


class Nodes:
    def __init__(self, nodes: Sequence[NodeSummary]) -> None:
        self._nodes = nodes

    def nodes(self) -> Sequence[NodeSummary]:
        return self._nodes


NOW = time.time()
LEDGER = [
    NodeSummary("gpu-b", 0.0, 0, 0, NOW - 60, "watched", "score 0.00", pool="pool=a"),
    NodeSummary("gpu-a", 1.96, 2, 2, NOW - 120, "suspected", "score 1.96 >= 1.5 with evidence from 2 jobs",
                fence="would-fence", fence_message="Dry run: would cordon node gpu-a",
                recent=(NodeIncidentRow(NOW - 120, "ml/a", "NotCompleted", "stuck-collective", 1.0,
                                        "<every rank entered>"),)),
]


async def _client(nodes: Nodes | None, middlewares: Sequence[object] = ()) -> TestClient[web.Request, web.Application]:
    parent = web.Application()
    parent.add_subapp("/ui", create_app(MemoryProvider(), nodes=nodes, middlewares=middlewares))
    client = TestClient(TestServer(parent))
    await client.start_server()
    return client


async def test_the_page_lists_suspected_nodes_first_escaped() -> None:
    client = await _client(Nodes(LEDGER))
    try:
        r = await client.get("/ui/nodes")
        text = await r.text()
        assert r.status == 200 and text.index('data-node="gpu-a"') < text.index('data-node="gpu-b"')
        assert "&lt;every rank entered&gt;" in text and "<every rank" not in text
        assert "would-fence: Dry run: would cordon node gpu-a" in text
        data = await (await client.get("/ui/api/nodes")).json()
        assert [(n["node"], n["state"], n["score"]) for n in data["nodes"]] == [("gpu-a", "suspected", 1.96),
                                                                                 ("gpu-b", "watched", 0.0)]
        assert data["nodes"][0]["recent"][0]["evidence"] == "stuck-collective"
        assert 'href="nodes"' in await (await client.get("/ui/")).text()
    finally:
        await client.close()


async def test_without_a_ledger_there_is_no_page_and_no_link() -> None:
    client = await _client(None)
    try:
        assert (await client.get("/ui/nodes")).status == 404
        assert 'href="nodes"' not in await (await client.get("/ui/")).text()
    finally:
        await client.close()


async def test_a_caller_who_may_not_list_the_ledger_is_refused() -> None:
    @web.middleware
    async def deny(request: web.Request, handler: object) -> web.StreamResponse:
        async def no() -> bool:
            return False

        request[VISIBLE_NODES] = no
        return await handler(request)  # type: ignore[operator,no-any-return]

    client = await _client(Nodes(LEDGER), [deny])
    try:
        assert (await client.get("/ui/api/nodes")).status == 403
    finally:
        await client.close()
