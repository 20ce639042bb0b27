#!/usr/bin/env python3
"""The live window of a 1,024-rank job, end to end: CPU per refresh and how far behind the page is.

What runs:
- stand-in sidecars (this script with `--serve`, a process of its own): `--pods` aiohttp sites on loopback,
  each answering `/v1/snapshot?entries=N` (gzip) for `--ranks-per-pod` ranks of one healthy NCCL-shaped job
  (one group, an all_reduce every 5 ms, every 7th a broadcast, arrival jitter up to 2 ms, one rank 30 ms
  late at every 10th, completed with durations). As the real sidecar does, what a pod serves changes at
  its full polls only (`--full-poll-s`, 30 s: the sidecar's defaults, --poll-interval 2 x
  --full-poll-every 15, on the job's common wall-clock slots: every pod at once); each full poll the job
  has moved on by `--advance` collectives (the whole window is new). `--full-poll-s 0`: new content at
  every request (the worst case: nothing can be kept). Each answer carries the real sidecar's ETag
  (frscope.wire's, of the pod and its content), and an If-None-Match naming it is answered 304, as the
  sidecar does: the stand-ins always run this tree's frscope (FRSCOPE_TREE is for the operator's side);
- the operator's `LiveWindows` in this process (the page open: the job asked about every 0.1 s,
  `--live-interval` 1 s), its `Decoder` with the operator's default 2 decoder processes.

Measured per refresh: wall time, CPU (this process and its decoder processes, from /proc), whether the
window was made anew; and for each full poll, how long after it the window showing it was there (behind).

    .venv/bin/python bench/live_refresh.py                                  # 1,024 ranks, 75 s
    .venv/bin/python bench/live_refresh.py --sequence                       # each kind of refresh alone
    FRSCOPE_TREE=/tmp/before .venv/bin/python bench/live_refresh.py         # another tree
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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

T0 = 1_700_000_000_000_000_000
STEP_NS = 5_000_000
VERSIONS = 4  # distinct contents a pod cycles through (built ahead: the farm's CPU stays out of it)


def recorder(rank: int, world: int, entries: int, first_seq: int, jitter: list[list[int]]) -> dict[str, Any]:
    """One rank's recorder as torch's `_dump_fr_trace_json` writes it: the collectives first_seq.. of
    the default group."""
    out = []
    for i in range(entries):
        seq = first_seq + i
        op = "broadcast" if seq % 7 == 0 else "all_reduce"
        sizes = [[16]] if op == "broadcast" else [[1024, 1024]]
        row = jitter[seq % len(jitter)]
        late = 30_000_000 if seq % 10 == 0 and rank == 517 % world else 0
        base = T0 + seq * STEP_NS
        created = base + row[rank] + late
        end = base + max(row) + 30_000_000 * (seq % 10 == 0) + 300_000 + (seq * 7919 + rank * 104_729) % 200_000
        out.append({"record_id": seq - 1, "pg_id": 0, "process_group": ["0", "default_pg"],
                    "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:" + op,
                    "time_created_ns": created, "time_discovered_started_ns": created + 1000,
                    "time_discovered_completed_ns": end, "duration_ms": (end - created - 1000) / 1e6,
                    "input_sizes": sizes, "input_dtypes": ["Float"], "output_sizes": sizes,
                    "output_dtypes": ["Float"], "state": "completed", "retired": True, "timeout_ms": 600000,
                    "is_p2p": False, "thread_id": "1", "thread_name": "python", "frames": []})
    last = first_seq + entries - 1
    return {"version": "2.10", "comm_lib_version": "2.27.7",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(world)))}},
            "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": last,
                                "last_completed_collective": last}},
            "entries": out}


def pod_body(pod: int, per_pod: int, world: int, entries: int, first_seq: int, jitter: list[list[int]]) -> bytes:
    captured = T0 + (first_seq + entries + 10) * STEP_NS
    pieces = [{"frscope_snapshot": 1, "rank": r, "captured_at_ns": captured, "source": f"socket:rank-{r}",
               "stacks": None, "trace": recorder(r, world, entries, first_seq, jitter)}
              for r in range(pod * per_pod, (pod + 1) * per_pod)]
    return json.dumps({"schema": "frscope.sidecar.snapshot/v1", "pod": f"train-worker-{pod}", "namespace": "ml",
                       "node": "n", "captured_at_ns": captured, "reason": "poll", "ranks": pieces,
                       "errors": []}).encode()


async def serve(args: argparse.Namespace) -> None:
    """The stand-in sidecars (their own process: their bodies and CPU are not the operator's)."""
    world = args.pods * args.ranks_per_pod
    rng = random.Random(0)
    jitter = [[rng.randrange(0, 2_000_000) for _ in range(world)] for _ in range(64)]
    bodies = [[gzip.compress(pod_body(p, args.ranks_per_pod, world, args.entries, 1 + v * args.advance, jitter), 1)
               for v in range(VERSIONS)] for p in range(args.pods)]
    from frscope import wire  # (this tree's: see measure())

    etags = [[wire.snapshot_etag([p, v, args.entries], gzip=True) for v in range(VERSIONS)] for p in range(args.pods)]
    started = time.time()
    asked = [0]

    manual = [0]

    def version() -> int:
        if args.sequence:
            return manual[0]
        if args.full_poll_s <= 0:
            asked[0] += 1
            return asked[0] // args.pods
        return int((time.time() - started) // args.full_poll_s)

    by_port: dict[int, int] = {}

    async def snapshot(request: web.Request) -> web.Response:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        pod = by_port[int(sockname[1])]
        at = version() % VERSIONS
        if wire.etag_matches(request.headers.get("If-None-Match"), etags[pod][at]):
            return web.Response(status=304, headers={"ETag": etags[pod][at]})
        # the envelope's head would carry the render time: the gzip of the same ranks differs anyway
        return web.Response(body=bodies[pod][at], content_type="application/json",
                            headers={"Content-Encoding": "gzip", "ETag": etags[pod][at]})

    async def full_poll(_: web.Request) -> web.Response:
        manual[0] += 1  # --sequence: every pod's next full poll, now
        return web.json_response({"version": manual[0]})

    app = web.Application()
    app.add_routes([web.get("/v1/snapshot", snapshot), web.post("/control/full-poll", full_poll)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ports = []
    for pod in range(args.pods):
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        by_port[ports[-1]] = pod
    size = sum(len(gzip.decompress(b[0])) for b in bodies)
    print(json.dumps({"ports": ports, "started": started, "json_bytes": size}), flush=True)
    await asyncio.Event().wait()


def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s() -> float:
    """This process and its children (the decoder processes), user + system."""
    me = os.getpid()
    kids = [int(c) for t in Path(f"/proc/{me}/task").glob("*") for c in (t / "children").read_text().split()]
    return cpu_s(me) + sum(cpu_s(k) for k in kids)


def start_farm() -> subprocess.Popen[str]:
    """The stand-in sidecars, with this tree's frscope whatever FRSCOPE_TREE says (the sidecars of both runs
    are the same; an operator that sends no If-None-Match gets every answer whole)."""
    env = {k: v for k, v in os.environ.items() if k != "FRSCOPE_TREE"}
    return subprocess.Popen([sys.executable, __file__, "--serve", *sys.argv[1:]], stdout=subprocess.PIPE, text=True,
                            env=env)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    farm = start_farm()
    assert farm.stdout is not None
    info = json.loads(farm.stdout.readline())
    world = args.pods * args.ranks_per_pod
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=world, conditions=[{"type": "Running"}])
    for pod, port in enumerate(info["ports"]):
        store.upsert_pod(PodInfo("ml", f"train-worker-{pod}", f"uid-{pod}", "train", "Worker", pod,
                                 "127.0.0.1", port, "Running", 0, (), False))
    decoder = Decoder(2)
    await decoder.warm_up()
    key = JobKey("ml", "train")
    refreshes: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        live = LiveWindows(store, SidecarClient(session), entries=args.entries, interval_s=args.live_interval,
                           decoder=decoder)
        inner = live.refresh

        async def refresh(job: JobKey) -> Any:
            wall, cpu = time.monotonic(), tree_cpu_s()
            before = live.window(job)
            window = await inner(job)
            made = window is not None and (before is None or window.timeline is not before.timeline)
            refreshes.append({"at": time.time(), "wall_s": time.monotonic() - wall, "cpu_s": tree_cpu_s() - cpu,
                              "made": made, "pods": window.pods if window else 0,
                              "failed": len(window.failures) if window else 0})
            return window

        live.refresh = refresh  # type: ignore[method-assign]
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            live.watch(key)  # the page asks every 0.1 s (its event stream)
            await asyncio.sleep(0.1)
        await live.close()
    decoder.close()
    farm.kill()
    farm.wait()
    # behind: for each full poll, from it to the end of the refresh that made the window showing it
    behind = []
    if args.full_poll_s > 0:
        polls = [info["started"] + k * args.full_poll_s for k in range(1, int(args.seconds // args.full_poll_s) + 1)]
        for poll in polls:
            made = [r for r in refreshes if r["made"] and r["at"] - r["wall_s"] >= poll]
            if made:
                behind.append(made[0]["at"] - poll)
    return {"refreshes": refreshes, "behind": behind, "json_mib": info["json_bytes"] / 2**20, "world": world}


async def sequence(args: argparse.Namespace) -> None:
    """Refreshes one after the other, each timed alone (CPU: this process and its decoder processes):
    the first (nothing decoded yet), then with every answer as before, then after every pod's full poll."""
    farm = start_farm()
    assert farm.stdout is not None
    info = json.loads(farm.stdout.readline())
    world = args.pods * args.ranks_per_pod
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=world, conditions=[{"type": "Running"}])
    for pod, port in enumerate(info["ports"]):
        store.upsert_pod(PodInfo("ml", f"train-worker-{pod}", f"uid-{pod}", "train", "Worker", pod,
                                 "127.0.0.1", port, "Running", 0, (), False))
    decoder = Decoder(2)
    await decoder.warm_up()
    key = JobKey("ml", "train")
    rows = []
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        # a deadline (3 intervals) no refresh reaches, whatever the machine's load: every pod is decoded
        live = LiveWindows(store, SidecarClient(session), entries=args.entries, interval_s=600, decoder=decoder)
        for step in ["first", "same", "same", "full poll", "same", "same"]:
            if step == "full poll":
                async with session.post(f"http://127.0.0.1:{info['ports'][0]}/control/full-poll") as r:
                    await r.read()
            before = live.window(key)
            wall, cpu = time.monotonic(), tree_cpu_s()
            window = await live.refresh(key)
            made = window is not None and (before is None or window.timeline is not before.timeline)
            rows.append({"refresh": step, "cpu_s": round(tree_cpu_s() - cpu, 2),
                         "wall_s": round(time.monotonic() - wall, 2), "window_made": made,
                         "pods": window.pods if window else 0, "failed": len(window.failures) if window else 0})
        await live.close()
    decoder.close()
    farm.kill()
    farm.wait()
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(frscope.__file__))).stdout.strip()
    print(f"tree {os.path.dirname(frscope.__file__)} ({git}); {world} ranks in {args.pods} pods, {args.entries} "
          f"entries a rank ({info['json_bytes'] / 2**20:.0f} MiB of JSON a refresh); Python "
          f"{platform.python_version()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    for row in rows:
        print(json.dumps(row))
    # With the sidecar's defaults (a full poll every 30 s) and the live interval (1 s): one refresh in 30
    # after a full poll, the other 29 between two.
    per_poll = round(30 / args.live_interval)
    same = statistics.fmean(r["cpu_s"] for r in rows if r["refresh"] == "same")
    after = next(r["cpu_s"] for r in rows if r["refresh"] == "full poll")
    print(json.dumps({"amortized_cpu_per_refresh_s": round((after + (per_poll - 1) * same) / per_poll, 3),
                      "refreshes_per_full_poll": per_poll}))


def report(args: argparse.Namespace, got: dict[str, Any]) -> None:
    rows = got["refreshes"][1:]  # the first makes the window from nothing in both trees
    cpu = [r["cpu_s"] for r in rows]
    wall = [r["wall_s"] for r in rows]
    made = [r for r in rows if r["made"]]
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(frscope.__file__))).stdout.strip()
    print(f"tree {os.path.dirname(frscope.__file__)} ({git}); {got['world']} ranks in {args.pods} pods, "
          f"{args.entries} entries a rank ({got['json_mib']:.0f} MiB of JSON a refresh), live interval "
          f"{args.live_interval:g} s, full polls every {args.full_poll_s:g} s, {args.seconds:g} s; Python "
          f"{platform.python_version()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(json.dumps({
        "refreshes": len(rows), "windows_made": len(made),
        "cpu_per_refresh_s": {"mean": round(statistics.fmean(cpu), 3), "median": round(statistics.median(cpu), 3),
                              "max": round(max(cpu), 3)},
        "cpu_when_made_s": round(statistics.fmean([r["cpu_s"] for r in made]), 3) if made else None,
        "cpu_when_kept_s": round(statistics.fmean([r["cpu_s"] for r in rows if not r["made"]]), 3)
        if len(made) < len(rows) else None,
        "wall_per_refresh_s": {"mean": round(statistics.fmean(wall), 3), "max": round(max(wall), 3)},
        "pods_answered": [r["pods"] for r in got["refreshes"]],
        "pods_failed": [r["failed"] for r in got["refreshes"]],
        "behind_after_full_poll_s": [round(b, 2) for b in got["behind"]],
    }))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=128)
    parser.add_argument("--ranks-per-pod", type=int, default=8)
    parser.add_argument("--entries", type=int, default=256, help="--live-entries")
    parser.add_argument("--advance", type=int, default=300, help="collectives a rank records between full polls")
    parser.add_argument("--full-poll-s", type=float, default=30.0, help="0: new content at every request")
    parser.add_argument("--live-interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=75.0)
    parser.add_argument("--sequence", action="store_true",
                        help="refreshes one at a time (first, same, same, after a full poll, same, same), each "
                             "timed alone, no deadline reached")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args))
        return 0
    if args.sequence:
        asyncio.run(sequence(args))
        return 0
    report(args, asyncio.run(measure(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
