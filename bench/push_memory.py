#!/usr/bin/env python3
"""What one maximum push, and reloading it at start, cost the operator's memory (issue 34).

A child process runs the operator's real HTTP server (`OperatorHttp`, open push auth, a real
`PushStore`, the evidence directory `--evidence-dir` keeps pushes in, and the decoder process pool of
`--decode-processes 2`) on loopback; this process POSTs one body of ~250 MiB (under the 256 MiB cap),
streamed from a file: 64 ranks, each a real recorded rank's snapshot (tests/data/real/hang) grown to
a 2,000-entry ring and ~2.9 MiB of thread stacks (a pod that dumps every thread's stack at every
entry). Then a second child does what the operator does at start with that evidence directory
(reload the kept push into a `PushStore`).

Reported, for each: the peak resident memory (VmHWM) of the operator's process, and of each decoder
process (separate processes: in a pod they count against the same container limit), the answer, the
time, and what the push store says the push keeps (`total_bytes`) against the measured growth.

    .venv/bin/python bench/push_memory.py                                  # this tree
    FRSCOPE_TREE=/tmp/before .venv/bin/python bench/push_memory.py         # another tree (git archive)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

SERVER = r"""
import asyncio, json, os, sys, time
if os.environ.get("FRSCOPE_TREE"):  # another tree: ahead of the editable install's finder
    sys.path.insert(0, os.environ["FRSCOPE_TREE"])
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
from pathlib import Path
from prometheus_client import CollectorRegistry
from frscope.operator.evidence.gather import Decoder
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.spill import EvidenceDir
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.serve.operator_http import Health, OperatorHttp

mode, evidence = sys.argv[1], Path(sys.argv[2])
import frscope
print("server runs", frscope.__file__, file=sys.stderr)

async def main():
    decoder = Decoder(2)
    spill = EvidenceDir(evidence)
    store = PushStore(on_drop=spill.remove)
    await decoder.warm_up()
    if mode == "reload":
        started = time.monotonic()
        if hasattr(spill, "reload"):
            async for kept in spill.reload(decoder, max_entries=200, ttl_s=store.ttl_s, plain_bytes=256 << 20):
                store.put(kept)
        else:  # a tree from before: decoded in this process
            for kept in await asyncio.to_thread(lambda: list(spill.load(max_entries=200, ttl_s=store.ttl_s))):
                store.put(kept)
        print(json.dumps({"pushes": len(store), "kept_bytes": store.total_bytes,
                          "seconds": round(time.monotonic() - started, 1)}), flush=True)
        await asyncio.sleep(0.5)
        print("done", flush=True)
        await asyncio.Event().wait()
    registry = CollectorRegistry()
    def on_push(evidence):
        store.put(evidence)
        print(json.dumps({"kept_bytes": store.total_bytes}), flush=True)
        return None
    http = OperatorHttp(registry=registry, metrics=OperatorMetrics(registry), health=Health(), on_push=on_push,
                        spill=spill, decoder=decoder)
    port = await http.start("127.0.0.1", 0)
    print(port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def reset_peaks(pids: list[int]) -> None:
    for pid in pids:
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def peaks_mib(pids: list[int]) -> list[int]:
    return [status_kib(p, "VmHWM") // 1024 for p in pids]


def rank_piece(base: dict[str, Any], rank: int, entries: int, stacks_bytes: int) -> bytes:
    piece = json.loads(json.dumps(base))
    piece["rank"] = rank
    ring = piece["trace"]["entries"]
    grown = []
    for i in range(entries):
        entry = dict(ring[i % len(ring)])
        entry["record_id"] = i
        if "collective_seq_id" in entry:
            entry["collective_seq_id"] = i + 1
        grown.append(entry)
    piece["trace"]["entries"] = grown
    line = ('  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", '
            "line 2501 in all_reduce\n")
    piece["stacks"] = "Thread 0x00007f (most recent call first):\n" + line * (stacks_bytes // len(line))
    return json.dumps(piece).encode()


def write_body(path: Path, ranks: int, entries: int, stacks_bytes: int) -> int:
    base = json.loads((REPO / "tests" / "data" / "real" / "hang" / "rank-0.json").read_text())
    head = {"schema": "frscope.sidecar.snapshot/v1", "pod": "big", "namespace": "ml", "node": "n",
            "captured_at_ns": time.time_ns(), "reason": "stall"}
    with path.open("wb") as out:
        out.write(json.dumps(head)[:-1].encode() + b', "ranks": [')
        for rank in range(ranks):
            out.write((b"," if rank else b"") + rank_piece(base, rank, entries, stacks_bytes))
        out.write(b'], "errors": []}')
    return path.stat().st_size


def push(port: int, body: Path) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", "X-Frscope-Namespace": "ml", "X-Frscope-Pod": "big",
               "Content-Length": str(body.stat().st_size)}
    with body.open("rb") as data:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/push", data=data, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=1200) as resp:
                return resp.status, resp.read().decode()[:100]
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()[:100]


def start(mode: str, evidence: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", SERVER, mode, str(evidence)], stdout=subprocess.PIPE, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--stacks-bytes", type=int, default=int(2.9 * 1024 * 1024))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="frscope-push-memory-") as tmp:
        body, evidence = Path(tmp) / "body.json", Path(tmp) / "evidence"
        size = write_body(body, args.ranks, args.entries, args.stacks_bytes)
        print(f"body: {size / 2**20:.0f} MiB, {args.ranks} ranks x {args.entries} entries, "
              f"{args.stacks_bytes / 2**20:.1f} MiB of stacks each; tree: {os.environ.get('FRSCOPE_TREE', REPO)}")
        server = start("serve", evidence)
        assert server.stdout is not None
        try:
            port = int(server.stdout.readline())
            workers = children(server.pid)
            idle = [status_kib(server.pid, "VmRSS") // 1024, *(status_kib(w, "VmRSS") // 1024 for w in workers)]
            reset_peaks([server.pid, *workers])
            started = time.monotonic()
            code, answer = push(port, body)
            took = time.monotonic() - started
            kept = json.loads(server.stdout.readline()) if code == 202 else {"kept_bytes": 0}
            peak = peaks_mib([server.pid, *workers])
            after = status_kib(server.pid, "VmRSS") // 1024
        finally:
            server.kill()
            server.wait()
        print(f"push: answer {code} {answer!r} in {took:.1f} s")
        print(f"  operator process: idle {idle[0]} MiB, peak {peak[0]} MiB, after {after} MiB")
        print(f"  decoder processes: idle {idle[1:]} MiB, peak {peak[1:]} MiB")
        print(f"  the push store counts {kept['kept_bytes'] / 2**20:.1f} MiB kept")
        reload = start("reload", evidence)
        assert reload.stdout is not None
        try:
            done = json.loads(reload.stdout.readline())
            reload.stdout.readline()
            workers = children(reload.pid)
            peak = peaks_mib([reload.pid, *workers])
            after = status_kib(reload.pid, "VmRSS") // 1024
        finally:
            reload.kill()
            reload.wait()
        print(f"reload at start: {done['pushes']} push(es) in {done['seconds']} s, "
              f"counted {done['kept_bytes'] / 2**20:.1f} MiB kept")
        print(f"  operator process: peak {peak[0]} MiB, after {after} MiB; decoder processes: peak {peak[1:]} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
