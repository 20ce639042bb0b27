#!/usr/bin/env python3
"""What a live window over one hostile pod costs the operator (issue 34).

One sidecar stand-in (an aiohttp server on loopback, in a process of its own) answers `/v1/snapshot`
with 1,024 ranks x 256 entries (each a real recorded rank's snapshot, tests/data/real/straggler,
grown): a pod that claims a thousand ranks. The operator's `LiveWindows` follows the job as the web
UI does while its page is open (`--live-interval` 1 s) for `--seconds`, in this process, with the
operator's decoder processes (`--decode-processes 2`) where the tree has them. Printed: this
process's RSS before, its peak (sampled every 0.1 s) and after; how late the event loop ran at worst
(a 0.1 s sleep that took longer); windows made and sidecar answers asked for.

    .venv/bin/python bench/live_memory.py
    FRSCOPE_TREE=/tmp/before .venv/bin/python bench/live_memory.py    # another tree (git archive)
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if os.environ.get("FRSCOPE_TREE"):  # another tree: ahead of the editable install's finder
    sys.path.insert(0, os.environ["FRSCOPE_TREE"])
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]

import aiohttp
from aiohttp import web

import frscope
from frscope.operator.evidence.gather import Decoder
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.model.objects import JobKey, JobRef, PodInfo
from frscope.operator.model.store import JobStore
from frscope.operator.serve.live_windows import LiveWindows
from frscope.records.limits import rss_bytes

REPO = Path(__file__).resolve().parents[1]


def body(ranks: int, entries: int) -> bytes:
    base = json.loads((REPO / "tests" / "data" / "real" / "straggler" / "rank-0.json").read_text())
    ring = base["trace"]["entries"]
    pieces = []
    for rank in range(ranks):
        piece = dict(base, rank=rank)
        grown = []
        for i in range(entries):
            entry = dict(ring[i % len(ring)], record_id=i)
            if "collective_seq_id" in entry:
                entry["collective_seq_id"] = i + 1
            grown.append(entry)
        piece["trace"] = dict(base["trace"], entries=grown)
        pieces.append(json.dumps(piece))
    head = {"schema": "frscope.sidecar.snapshot/v1", "pod": "train-worker-0", "namespace": "ml", "node": "n",
            "captured_at_ns": time.time_ns(), "reason": "refresh", "errors": []}
    return (json.dumps(head)[:-1] + ', "ranks": [' + ",".join(pieces) + "]}").encode()


async def serve(ranks: int, entries: int) -> None:
    """The stand-in sidecar (in its own process: its body and buffers are not the operator's)."""
    raw = body(ranks, entries)

    async def snapshot(_: web.Request) -> web.Response:
        print("asked", flush=True)
        return web.Response(body=raw, content_type="application/json")

    app = web.Application()
    app.add_routes([web.get("/v1/snapshot", snapshot)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], len(raw), flush=True)  # type: ignore[union-attr]
    await asyncio.Event().wait()


async def main(seconds: float, ranks: int, entries: int) -> None:
    sidecar = subprocess.Popen([sys.executable, __file__, "--serve", "--ranks", str(ranks), "--entries", str(entries)],
                               stdout=subprocess.PIPE, text=True)
    assert sidecar.stdout is not None
    port_text, size_text = sidecar.stdout.readline().split()
    port, size = int(port_text), int(size_text)
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=ranks, conditions=[{"type": "Running"}])
    store.upsert_pod(PodInfo("ml", "train-worker-0", "uid-0", "train", "Worker", 0, "127.0.0.1", port, "Running", 0,
                             (), False))
    decoder = Decoder(2)
    await decoder.warm_up()
    before = rss_bytes() or 0
    peak, late, windows = before, 0.0, 0
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        params = inspect.signature(LiveWindows).parameters
        extra = {"decoder": decoder} if "ranks_per_pod" in params else {}  # a tree from before: its own threads
        live = LiveWindows(store, SidecarClient(session), entries=entries, interval_s=1.0, **extra)  # type: ignore[arg-type]
        key = JobKey("ml", "train")
        end = time.monotonic() + seconds
        last = None
        while time.monotonic() < end:
            live.watch(key)  # the page asks every 0.1 s (its event stream)
            started = time.monotonic()
            await asyncio.sleep(0.1)
            late = max(late, time.monotonic() - started - 0.1)
            peak = max(peak, rss_bytes() or 0)
            window = live.window(key)
            if window is not None and window is not last:
                windows += 1
                last = window
        await live.close()
    after = rss_bytes() or 0
    decoder.close()
    sidecar.kill()
    asked = [sum(1 for line in sidecar.communicate()[0].splitlines() if line == "asked")]
    print(f"tree: {os.path.dirname(frscope.__file__)}; one pod answering {ranks} ranks x {entries} entries "
          f"({size / 2**20:.0f} MiB of JSON), page open {seconds:.0f} s")
    print(f"operator process RSS: before {before / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB, "
          f"after {after / 2**20:.0f} MiB; event loop late by {late:.2f} s at worst; {windows} window(s), "
          f"{asked[0]} snapshot(s) asked")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=256)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    asyncio.run(serve(args.ranks, args.entries) if args.serve else main(args.seconds, args.ranks, args.entries))
