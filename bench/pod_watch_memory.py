#!/usr/bin/env python3
"""The operator's memory for watching one job's N pods, before any stall (issue 36, item 3).

A real kube-apiserver + etcd (testenv), the PyTorchJob and report CRDs, one PyTorchJob and its N pods
created through the API (each pod shaped as in bench/operator_scale.py: the opt-in and job labels, an
owner reference, a sidecar init container with its port named `frscope`, a kubelet-like status). Then
`frscope operator` from each `--tree` in turn starts against them (the pods exist before it: its first
LIST reads all of them) and is measured until it reports every pod watched and for `--settle` seconds
after: its peak RSS (VmHWM), its RSS at the end, the seconds until every pod was watched and its CPU
seconds (user + system) from its start to the end. No
sidecar answers here (the pods' sidecar ports are closed on 127.0.0.1, and the status sweep runs every
`--poll-interval` seconds): this is the cost of knowing the pods, not of a gather.

    .venv/bin/python bench/pod_watch_memory.py --pods 8192 16384 --tree /path/to/before --tree .
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from operator_scale import REPO, bin_dir, cpu_s, create_objects, load_cluster, metric, rss_kib


def measure(plane: Any, cluster: Any, work: Path, tree: Path, pods: int, args: argparse.Namespace) -> dict[str, Any]:
    port = cluster.free_port()
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "PYTHONPATH": str(tree)}
    log_path = work / f"operator-{tree.resolve().name}-{pods}.log"
    with open(log_path, "wb") as log:
        op = subprocess.Popen([sys.executable, "-m", "frscope", "operator", "--http-host", "127.0.0.1",
                               "--http-port", str(port), "--poll-interval", str(args.poll_interval),
                               "--namespace", "bench"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree)
        try:
            started = time.monotonic()
            watched_s = float("nan")
            peak = 0
            while time.monotonic() - started < args.timeout:
                if op.poll() is not None:
                    raise SystemExit(f"the operator exited:\n{log_path.read_text()[-3000:]}")
                peak = max(peak, rss_kib(op.pid))
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                        seen = metric(r.read().decode(), "frscope_operator_pods_watched")
                except OSError:
                    seen = None
                if seen == pods:
                    watched_s = time.monotonic() - started
                    break
                time.sleep(0.2)
            settle_end = time.monotonic() + args.settle
            while time.monotonic() < settle_end:
                peak = max(peak, rss_kib(op.pid))
                time.sleep(0.2)
            git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=tree).stdout.strip()
            row = {"tree": str(tree), "commit": git, "pods": pods, "watched_s": watched_s,
                   "peak_rss_mib": max(peak, rss_kib(op.pid, "VmHWM")) / 1024,
                   "settled_rss_mib": rss_kib(op.pid) / 1024, "cpu_s": cpu_s(op.pid),
                   "load": os.getloadavg()[0]}
            print(json.dumps(row), flush=True)
            return row
        finally:
            op.send_signal(signal.SIGTERM)
            try:
                op.wait(timeout=30)
            except subprocess.TimeoutExpired:
                op.kill()
                op.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[8192])
    parser.add_argument("--tree", type=Path, action="append", required=True, help="a frscope source tree")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds measured after every pod is watched")
    parser.add_argument("--poll-interval", type=float, default=3600.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for every pod watched")
    args = parser.parse_args()
    cluster = load_cluster()
    crd_dir = bin_dir().parent / "crds"
    crds = [next(iter(sorted(crd_dir.glob("kubeflow.org_pytorchjobs.yaml")))),
            REPO / "charts/frscope/crds/flightrecorderreport.yaml"]
    work = Path(tempfile.mkdtemp(prefix="frscope-podmem-"))
    rows: list[dict[str, Any]] = []
    for pods in args.pods:
        plane = cluster.start(bin_dir(), crds=[], controller_manager=False)
        try:
            for crd in crds:
                plane.kubectl("apply", "-f", str(crd))
            time.sleep(3)
            # Closed ports on loopback: the sidecars are not what is measured (5 s poll timeouts never wait).
            ports = {f"bench-worker-{i}": ("127.0.0.1", 1 + i % 1000) for i in range(pods)}
            made = asyncio.run(create_objects(plane.server, plane.admin_token, plane.ca_file, ports, pods))
            print(f"created the job and {pods} pods in {made:.0f} s", file=sys.stderr, flush=True)
            rows += [measure(plane, cluster, work, tree, pods, args) for tree in args.tree]
        finally:
            plane.stop()
    print("\n| pods | tree | every pod watched after | peak RSS | RSS settled | CPU | load |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['pods']:,} | {r['commit']} | {r['watched_s']:.1f} s | {r['peak_rss_mib']:.0f} MiB | "
              f"{r['settled_rss_mib']:.0f} MiB | {r['cpu_s']:.1f} s | {r['load']:.1f} |")
    print(f"logs in {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
