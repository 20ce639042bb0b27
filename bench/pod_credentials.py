#!/usr/bin/env python3
"""What per-pod credentials cost the operator at `--pods` pods (issue 26), in the operator's own code:

- `injection.polled_pod` on every pod event: the check that a pod's `frscope` port is served by the
  sidecar as injected (8,192 pod bodies made by the real `injection.inject`);
- `kube.pod_tokens.PodTokens`: minting one token per pod through the operator's real `KubeClient` over
  HTTP (64 at a time, as the status sweep's concurrency), then one sweep's worth of cache hits, from
  a loopback aiohttp stand-in that answers at once (the operator's side alone) and, with
  `--real-api-server`, from the real kube-apiserver of testenv (which signs each token).

    .venv/bin/python bench/pod_credentials.py --pods 8192 [--real-api-server]
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


async def mint_real(pods: int) -> tuple[float, float, int]:
    """The same minting against testenv's real API server (the account `frscope/frscope`)."""
    import importlib.util
    import ssl
    import subprocess

    from frscope.operator.kube import StaticToken

    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("frscope_testenv_cluster", repo / "testenv" / "cluster.py")
    assert spec is not None and spec.loader is not None
    cluster = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = cluster
    spec.loader.exec_module(cluster)
    check = subprocess.run([str(repo / "testenv" / "build"), "--check"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise SystemExit("testenv is not built: run `make testenv`")
    plane = cluster.start(Path(check.stdout.strip().splitlines()[-1]), crds=[], controller_manager=False)
    try:
        plane.kubectl("create", "namespace", "frscope")
        plane.kubectl("create", "serviceaccount", "frscope", "-n", "frscope")
        context = ssl.create_default_context(cafile=str(plane.ca_file))
        gate = asyncio.Semaphore(64)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            tokens = PodTokens(KubeClient(session, plane.server, auth=StaticToken(plane.admin_token)),
                               "system:serviceaccount:frscope:frscope")

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
            return mint_s, hit_s, tokens.minted
    finally:
        plane.stop()


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
    parser.add_argument("--real-api-server", action="store_true", help="also mint from testenv's kube-apiserver")
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
    if args.real_api_server:
        real_mint_s, real_hit_s, real_minted = asyncio.run(mint_real(args.pods))
        print(f"real kube-apiserver: {real_minted} TokenRequests in {real_mint_s:.1f} s "
              f"({real_mint_s * 1e3 / args.pods:.2f} ms a pod, 64 at a time); a sweep of cache hits "
              f"{real_hit_s * 1e3:.0f} ms")
    print(f"| pods | polled_pod (each pod event) | {minted} TokenRequests over HTTP (operator side) "
          "| one sweep of cache hits |")
    print("|---|---|---|---|")
    print(f"| {args.pods} | {check_s * 1e6 / args.pods:.0f} µs a pod ({check_s:.2f} s all) | {mint_s:.1f} s "
          f"({mint_s * 1e3 / args.pods:.2f} ms a pod) | {hit_s * 1e3:.0f} ms "
          f"({hit_s * 1e6 / args.pods:.1f} µs a pod) |")


if __name__ == "__main__":
    main()
