#!/usr/bin/env python3
"""What per-pod credentials cost the operator at `--pods` pods (issue 26), in the operator's own code:

- `injection.polled_pod` on every pod event: the check that a pod's `frscope` port is served by the
  sidecar as injected (8,192 pod bodies made by the real `injection.inject`);
- `kube.pod_tokens.PodTokens`: minting one token per pod through the operator's real `KubeClient` over
  HTTP (64 at a time, as the status sweep's concurrency), then one sweep's worth of cache hits. The
  TokenRequest endpoint is a loopback aiohttp stand-in that answers at once: the API server's own cost
  (it signs each token) is not in these numbers, only the operator's side.

    .venv/bin/python bench/pod_credentials.py --pods 8192
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frscope.operator.injection import InjectionConfig, inject, polled_pod
from frscope.operator.kube import KubeClient
from frscope.operator.kube.pod_tokens import PodTokens
from tests.unit.operator import builders

CFG = InjectionConfig(image="registry.example/frscope:1", operator_identity="system:serviceaccount:frscope:frscope")


async def mint_all(pods: int) -> tuple[float, float, int]:
    minted = 0

    async def token_request(request: web.Request) -> web.Response:
        nonlocal minted
        minted += 1
        body = await request.json()
        return web.json_response({"status": {"token": "t." + body["spec"]["audiences"][0],
                                             "expirationTimestamp": "2099-01-01T00:00:00Z"}}, status=201)

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/frscope/serviceaccounts/frscope/token", token_request)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    gate = asyncio.Semaphore(64)
    try:
        async with aiohttp.ClientSession() as session:
            tokens = PodTokens(KubeClient(session, url), "system:serviceaccount:frscope:frscope")

            async def one(i: int) -> str:
                async with gate:
                    return await tokens.token("ml", f"train-worker-{i}")

            started = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(pods)))
            mint_s = time.perf_counter() - started
            started = time.perf_counter()
            for i in range(pods):
                await tokens.token("ml", f"train-worker-{i}")
            hit_s = time.perf_counter() - started
    finally:
        await runner.cleanup()
    return mint_s, hit_s, minted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=8192)
    args = parser.parse_args()
    template = builders.pod("train-worker-0", port=None)
    del template["spec"]["initContainers"]
    bodies = []
    for i in range(args.pods):
        body = copy.deepcopy(template)
        body["metadata"]["name"] = f"train-worker-{i}"
        injected = inject(body, CFG)
        assert injected is not None
        injected["status"] = body["status"]
        bodies.append(injected)
    started = time.perf_counter()
    trusted = sum(1 for b in bodies if polled_pod(b, CFG)[1] is None)
    check_s = time.perf_counter() - started
    assert trusted == args.pods
    mint_s, hit_s, minted = asyncio.run(mint_all(args.pods))
    print(f"| pods | polled_pod (each pod event) | {minted} TokenRequests over HTTP (operator side) "
          "| one sweep of cache hits |")
    print("|---|---|---|---|")
    print(f"| {args.pods} | {check_s * 1e6 / args.pods:.0f} µs a pod ({check_s:.2f} s all) | {mint_s:.1f} s "
          f"({mint_s * 1e3 / args.pods:.2f} ms a pod) | {hit_s * 1e3:.0f} ms "
          f"({hit_s * 1e6 / args.pods:.1f} µs a pod) |")


if __name__ == "__main__":
    main()
