"""Pushes that cost the operator far more than their size (issue 26) are refused before anything is
built from them, through the operator's real HTTP server: a gzip body inflates to at most a multiple
of its size, a body of tiny JSON containers is refused before decoding, and a pod's body holds at most
`MAX_PIECES` rank pieces. The memory each costs is measured in bench/push_bomb.py."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from frscope.operator.evidence import pod_evidence
from tests.unit.operator.test_http import Server, body

HEAD = ('{"schema": "frscope.sidecar.snapshot/v1", "pod": "p", "namespace": "ml", "node": "n", '
        '"captured_at_ns": 1, "reason": "stall", "errors": [], "ranks": [')


def pieces(piece: str, count: int) -> bytes:
    return (HEAD + ",".join([piece] * count) + "]}").encode()


@pytest.fixture
async def open_server() -> AsyncIterator[Server]:
    srv = Server(max_push_bytes=8 << 20)
    srv.url = f"http://127.0.0.1:{await srv.http.start('127.0.0.1', 0)}"
    yield srv
    await srv.http.stop()


async def post(server: Server, data: bytes) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", "X-Frscope-Pod": "p", "X-Frscope-Namespace": "ml"}
    if data[:2] == b"\x1f\x8b":
        headers["Content-Encoding"] = "gzip"
    async with aiohttp.ClientSession() as s:
        async with s.post(server.url + "/v1/push", data=data, headers=headers) as r:
            return r.status, await r.json(content_type=None)


async def test_a_gzip_bomb_is_refused_past_its_expansion(open_server: Server) -> None:
    bomb = gzip.compress(pieces("{}", 700_000), 9)  # 2 MiB of `{}` in ~2 KiB
    assert len(bomb) < 4096
    code, answer = await post(open_server, bomb)
    assert code == 400 and "once decompressed" in answer["error"], answer
    assert open_server.pushed == []


async def test_tiny_containers_are_refused_before_decoding(open_server: Server, hang_ranks: dict[int, Any]) -> None:
    code, answer = await post(open_server, pieces("{}", 100_000))  # not gzipped: 300 KB of `{}`
    assert code == 400 and f"more than {pod_evidence.MAX_PIECES} rank pieces" in answer["error"], answer
    assert open_server.pushed == []
    # One rank made of tiny arrays is that rank's problem; the pod's other ranks are kept.
    good = json.loads(body(hang_ranks))
    bad = {"frscope_snapshot": 1, "rank": 9, "captured_at_ns": 1, "source": "x", "stacks": None,
           "trace": {"entries": [[]] * 100_000}}
    good["ranks"].append(bad)
    code, answer = await post(open_server, json.dumps(good).encode())
    assert code == 202, answer
    [evidence] = open_server.pushed
    assert evidence.ranks == (0, 1, 2, 3)
    assert any("tiny JSON objects" in str(p) for p in evidence.problems), evidence.problems


async def test_a_pod_body_holds_a_bounded_number_of_pieces(open_server: Server) -> None:
    code, answer = await post(open_server, gzip.compress(pieces('{"rank": 0}', pod_evidence.MAX_PIECES + 1)))
    assert code == 400 and f"more than {pod_evidence.MAX_PIECES}" in answer["error"], answer
    assert open_server.pushed == []


async def test_a_real_gzip_push_still_lands(open_server: Server, hang_ranks: dict[int, Any]) -> None:
    code, answer = await post(open_server, gzip.compress(body(hang_ranks)))
    assert code == 202, answer
    [evidence] = open_server.pushed
    assert evidence.ranks == (0, 1, 2, 3) and evidence.size_bytes == len(body(hang_ranks))
    plain = json.loads(body(hang_ranks))
    assert len(plain["ranks"]) == 4


async def test_a_push_decodes_in_the_decode_processes(hang_ranks: dict[int, Any]) -> None:
    """With decode processes (the operator's default: 2), a push is decoded there, not in a thread of
    the event loop's process (json holds the GIL for a whole body)."""
    from prometheus_client import CollectorRegistry

    from frscope.operator.evidence.gather import Decoder
    from frscope.operator.model.operator_metrics import OperatorMetrics
    from frscope.operator.serve.operator_http import OperatorHttp

    srv = Server(max_push_bytes=8 << 20)
    decoder = Decoder(1)
    registry = CollectorRegistry()
    srv.http = OperatorHttp(registry=registry, metrics=OperatorMetrics(registry), health=srv.health,
                            on_push=srv.on_push, max_push_bytes=8 << 20, decoder=decoder)
    srv.url = f"http://127.0.0.1:{await srv.http.start('127.0.0.1', 0)}"
    try:
        code, answer = await post(srv, gzip.compress(body(hang_ranks)))
        assert code == 202, answer
        code, answer = await post(srv, gzip.compress(pieces("{}", 700_000), 9))
        assert code == 400 and "once decompressed" in answer["error"], answer
        assert [e.ranks for e in srv.pushed] == [(0, 1, 2, 3)]
    finally:
        await srv.http.stop()
        decoder.close()
