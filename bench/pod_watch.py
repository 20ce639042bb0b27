#!/usr/bin/env python3
"""The operator's pod watch with unrelated pods churning: CPU and memory of `frscope operator`.

A real kube-apiserver + etcd (testenv, no controller manager, no scheduler: pods stay Pending and are
deleted at once), the PyTorchJob and report CRDs, and `frscope operator` from a given source tree
(`--tree`; run it once with the tree before the change and once after). Then N pods that belong to no
training job are created through the API (16 requests in flight), each gets one status update (what a
kubelet's first report is), and all are deleted: 3N pod events in the cluster. Measured: the operator's
CPU seconds (user + system, its decode workers included) from just before the churn to 5 s after, and
its peak RSS (VmHWM) at the end.

    .venv/bin/python bench/pod_watch.py --pods 5000 --tree /path/to/before --tree .
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from operator_scale import REPO, bin_dir, children, cpu_s, load_cluster, rss_kib


async def churn(server: str, token: str, ca: Path, pods: int) -> float:
    import aiohttp

    started = time.monotonic()
    ctx = ssl.create_default_context(cafile=str(ca))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=16),
                                     headers={"Authorization": f"Bearer {token}"}) as s:
        async def call(method: str, path: str, body: Any, ctype: str = "application/json") -> None:
            for attempt in range(5):
                async with s.request(method, server + path, data=json.dumps(body) if body is not None else None,
                                     headers={"Content-Type": ctype}) as r:
                    await r.read()
                    if r.status < 300 or (method == "DELETE" and r.status == 404):
                        return
                    if r.status in (409, 429) or r.status >= 500:
                        await asyncio.sleep(0.2 * (attempt + 1))
                        continue
                    raise RuntimeError(f"{method} {path}: {r.status}")
            raise RuntimeError(f"{method} {path}: gave up")

        async def one(i: int, sem: asyncio.Semaphore) -> None:
            name = f"web-{i}"
            async with sem:
                await call("POST", "/api/v1/namespaces/churn/pods", {
                    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]}})
                await call("PATCH", f"/api/v1/namespaces/churn/pods/{name}/status",
                           {"status": {"phase": "Running", "podIP": "10.0.0.1"}}, "application/merge-patch+json")
                await call("DELETE", f"/api/v1/namespaces/churn/pods/{name}", None)

        sem = asyncio.Semaphore(16)
        await asyncio.gather(*(one(i, sem) for i in range(pods)))
    return time.monotonic() - started


def run_tree(cluster: Any, plane: Any, tree: Path, pods: int, work: Path) -> dict[str, Any]:
    port = cluster.free_port()
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "PYTHONPATH": str(tree)}
    log = open(work / f"operator-{port}.log", "wb")
    op = subprocess.Popen([sys.executable, "-m", "frscope", "operator", "--http-host", "127.0.0.1",
                           "--http-port", str(port), "--sidecar-auth", "none"],
                          env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree)
    try:
        deadline = time.monotonic() + 120
        while True:
            if op.poll() is not None:
                raise SystemExit(f"the operator exited:\n{(work / f'operator-{port}.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the operator did not get ready")
            time.sleep(0.5)
        time.sleep(3)
        before = cpu_s(op.pid) + sum(cpu_s(c) for c in children(op.pid))
        rss_before = rss_kib(op.pid)
        took = asyncio.run(churn(plane.server, plane.admin_token, plane.ca_file, pods))
        time.sleep(5)
        used = cpu_s(op.pid) + sum(cpu_s(c) for c in children(op.pid)) - before
        return {"tree": str(tree), "pods": pods, "churn_s": round(took, 1), "operator_cpu_s": round(used, 2),
                "rss_before_mib": round(rss_before / 1024, 1),
                "peak_rss_mib": round(rss_kib(op.pid, "VmHWM") / 1024, 1), "load": os.getloadavg()[0]}
    finally:
        op.send_signal(signal.SIGTERM)
        try:
            op.wait(timeout=20)
        except subprocess.TimeoutExpired:
            op.kill()
            op.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--tree", type=Path, action="append", required=True, help="a frscope source tree")
    args = parser.parse_args()
    cluster = load_cluster()
    crd_dir = bin_dir().parent / "crds"
    crds = [*sorted(crd_dir.glob("kubeflow.org_pytorchjobs.yaml")),
            REPO / "charts/frscope/crds/flightrecorderreport.yaml"]
    work = Path(tempfile.mkdtemp(prefix="frscope-podwatch-"))
    plane = cluster.start(bin_dir(), crds=[], controller_manager=False)
    try:
        for crd in crds:
            plane.kubectl("apply", "-f", str(crd))
        plane.kubectl("create", "namespace", "churn")
        plane.kubectl("create", "serviceaccount", "default", "-n", "churn")  # no controller manager here
        time.sleep(3)
        for tree in args.tree:
            print(json.dumps(run_tree(cluster, plane, tree.resolve(), args.pods, work)), flush=True)
    finally:
        plane.stop()
        print(f"logs in {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
