#!/usr/bin/env python3
"""What one small gzip push costs the operator (issue 26): peak memory of the operator's real HTTP server.

A child process runs `OperatorHttp` (the operator's aiohttp server, open push auth, a real `PushStore`)
on loopback; this process POSTs one body to `/v1/push` at a time, `Content-Encoding: gzip` as a sidecar
does, and reads the child's peak resident memory (VmHWM, reset before each push through
/proc/PID/clear_refs). Bodies:
- `braces`: a snapshot envelope whose `ranks` are `{}` repeated: ~4 MiB of them gzip to ~4 KiB;
- the same not gzipped; pieces of 12 bytes (`{"rank": 0}`), as many objects as the JSON check lets in;
- `real`: a real pod's snapshot (two ranks of the recorded hang), as a sidecar pushes it.
Printed: the wire size, the decompressed size, the answer, and the peak RSS above the idle server.

    .venv/bin/python bench/push_bomb.py                  # prints a table, appends it to RESULTS.md
    .venv/bin/python bench/push_bomb.py --no-results
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SERVER = r"""
import asyncio, sys
from prometheus_client import CollectorRegistry
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.serve.operator_http import Health, OperatorHttp

async def main():
    registry = CollectorRegistry()
    store = PushStore()
    def on_push(evidence):
        store.put(evidence)
        return None
    http = OperatorHttp(registry=registry, metrics=OperatorMetrics(registry), health=Health(), on_push=on_push)
    port = await http.start("127.0.0.1", 0)
    print(port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def push(port: int, body: bytes) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", "X-Frscope-Namespace": "ml", "X-Frscope-Pod": "bomb"}
    if body[:2] == b"\x1f\x8b":
        headers["Content-Encoding"] = "gzip"
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/push", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return resp.status, resp.read().decode()[:80]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()[:80]


def braces(decoded_mib: float) -> bytes:
    count = int(decoded_mib * (1 << 20) / 3)
    head = '{"schema": "frscope.sidecar.snapshot/v1", "pod": "bomb", "namespace": "ml", "node": "n", ' \
           '"captured_at_ns": 1, "reason": "stall", "errors": [], "ranks": ['
    return (head + ",".join(["{}"] * count) + "]}").encode()


def small_pieces(decoded_mib: float) -> bytes:
    """Pieces of 12 bytes (`{"rank": 0}`): as many objects as the container check lets through."""
    count = int(decoded_mib * (1 << 20) / 12)
    head = '{"schema": "frscope.sidecar.snapshot/v1", "pod": "bomb", "namespace": "ml", "node": "n", ' \
           '"captured_at_ns": 1, "reason": "stall", "errors": [], "ranks": ['
    return (head + ",".join(['{"rank": 0}'] * count) + "]}").encode()


def real() -> bytes:
    sys.path.insert(0, str(REPO))
    from tests.unit.operator.fakes import real_snapshots

    ranks = real_snapshots("hang")
    return json.dumps({"schema": "frscope.sidecar.snapshot/v1", "pod": "p", "namespace": "ml", "node": "n",
                       "captured_at_ns": 1, "reason": "stall", "errors": [],
                       "ranks": [ranks[r] for r in sorted(ranks)[:2]]}).encode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args()
    bodies = [("real pod snapshot (2 ranks)", real(), True), ("`{}` pieces, 4 MiB", braces(4), True),
              ("`{}` pieces, 16 MiB", braces(16), True), ("`{}` pieces, 4 MiB, not gzipped", braces(4), False),
              ('`{"rank": 0}` pieces, 1.1 MiB', small_pieces(1.1), True)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, env=env, cwd=REPO)
    rows = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        time.sleep(0.5)
        for name, decoded, gzipped in bodies:
            wire = gzip.compress(decoded, 9) if gzipped else decoded
            Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
            idle = rss_kib(proc.pid)
            started = time.monotonic()
            code, answer = push(port, wire)
            elapsed = time.monotonic() - started
            peak = peak_kib(proc.pid) - idle
            rows.append(f"| {name} | {len(wire) / 1024:.1f} KiB | {len(decoded) / (1 << 20):.1f} MiB | {code} "
                        f"| +{peak / 1024:.0f} MiB | {elapsed:.2f} s | {answer.replace('|', '/')} |")
    finally:
        proc.kill()
        proc.wait()
    table = "\n".join([
        f"`.venv/bin/python bench/push_bomb.py` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} shared cores)", "",
        "| body | on the wire | decompressed | HTTP | peak RSS of the operator | time | answer |",
        "|---|---|---|---|---|---|---|", *rows])
    print(table)
    if not args.no_results:
        with (REPO / "bench" / "RESULTS.md").open("a") as handle:
            handle.write("\n## Issue 26: one small gzip push at the operator\n\n" + table + "\n")


if __name__ == "__main__":
    main()
