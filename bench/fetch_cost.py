#!/usr/bin/env python3
"""Full reads at scale: what each sidecar action costs a training step, and what that makes at 10,000 ranks.

What it runs: 4 gloo ranks of bench/sidecar_train.py on loopback (fixed compute per step: 8 matmuls
of 96x96 and one 64 KiB all_reduce; recorders filled to 2,000 entries first; the worker-server socket
from the sitecustomize bootstrap). No sidecar: this script plays its requests, through the sidecar's
own `WorkerClient`, in phases of --phase seconds:

- off: nothing (the baseline; run first and last, their difference is the noise floor);
- probe: the progress probe (`frscope_progress`) of one rank, every ~0.25 s at random moments;
- full: the full recorder (`fr_trace_json`) of one rank, every ~1 s at random moments;
- stacks: `dump_traceback` of one rank, every ~1 s;
- full, all ranks at once: every rank's full recorder in the same moment, every ~2 s (the shape of
  the wall-clock schedule, frscope/sidecar/schedule.py).

What it measures: the job's step is rank 0's (its all_reduce waits for the slowest rank, so a read on
any rank shows there). A step that overlaps a request is hit; a request's cost to the job is the hit
steps' time beyond the baseline median, summed, per request. Then the model (method in RESULTS.md):
at N ranks with a read every P seconds per rank at independent moments, a step of T seconds holds
at least one read with probability 1 - exp(-N T / P) and is delayed by about one read's cost (the
ranks read in parallel, the step waits for the slowest); with aligned reads the job pays one
all-ranks read a period.

    .venv/bin/python bench/fetch_cost.py                       # writes the section of bench/RESULTS.md
    .venv/bin/python bench/fetch_cost.py --phase 10 --results /tmp/r.md   # quick look
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidecar_overhead import start_ranks, write_section

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Full reads at scale"
RANKS = 4


def steps_of(logs: Path, rank: int, start: float, end: float) -> list[tuple[float, float]]:
    """(start time, duration) of the rank's steps that ended in [start, end]."""
    out = []
    for line in (logs / f"steps-{rank}.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            t, d = float(parts[0]), float(parts[1])
            if start <= t <= end:
                out.append((t - d, d))
    return out


async def play(kind: str, sockets: Path, seconds: float) -> list[tuple[float, float]]:
    """Issue the phase's requests for `seconds`; returns their (start, end) wall times."""
    from frscope.sidecar.client import WorkerClient

    clients = {r: WorkerClient(sockets / f"rank-{r}.sock", timeout_s=30, max_bytes=256 << 20) for r in range(RANKS)}
    spans: list[tuple[float, float]] = []
    gap = {"probe": 0.25, "full": 1.0, "stacks": 1.0, "full_all": 2.0}.get(kind)
    end = time.time() + seconds
    try:
        while time.time() < end:
            if gap is None:
                await asyncio.sleep(0.5)
                continue
            await asyncio.sleep(random.uniform(0.5, 1.5) * gap)
            t0 = time.time()
            if kind == "probe":
                await clients[1].probe("frscope_progress", "")
            elif kind == "full":
                await clients[1].fr_trace_json()
            elif kind == "stacks":
                await clients[1].dump_traceback(30, 1 << 20)
            else:
                await asyncio.gather(*(c.fr_trace_json() for c in clients.values()))
            spans.append((t0, time.time()))
    finally:
        for c in clients.values():
            await c.close()
    return spans


def cost(steps: list[tuple[float, float]], spans: list[tuple[float, float]], base: float) -> dict[str, Any]:
    hit = [d for s, d in steps if any(s < b and a < s + d for a, b in spans)]
    excess = sum(d - base for d in hit)
    return {
        "requests": len(spans), "steps": len(steps), "hit": len(hit),
        "request_ms": 1000 * statistics.mean(b - a for a, b in spans) if spans else 0.0,
        "excess_ms": 1000 * excess / len(spans) if spans else 0.0,
        "median_ms": 1000 * statistics.median(d for _s, d in steps),
    }


def slowdown_independent(x_s: float, n: int, step_s: float, period_s: float) -> float:
    hit = 1 - math.exp(-n * step_s / period_s)
    return hit * x_s / step_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", type=float, default=30.0, help="seconds per phase")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "RESULTS.md")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="frscope-fetch-cost-"))
    sockets, logs = work / "sockets", work / "logs"
    sockets.mkdir()
    logs.mkdir()
    load_start = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    procs = start_ranks(RANKS, work, sockets, logs)
    try:
        deadline = time.time() + 600
        while not all((logs / f"warm-{r}").exists() for r in range(RANKS)):
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit(f"ranks did not warm up; logs in {logs}")
            time.sleep(0.5)
        time.sleep(3)
        phases = ["off", "probe", "full", "stacks", "full_all", "off"]
        windows: list[tuple[str, float, float, list[tuple[float, float]]]] = []
        for kind in phases:
            t0 = time.time()
            spans = asyncio.run(play(kind, sockets, args.phase))
            windows.append((kind, t0 + 1, time.time(), spans))
            print(f"{kind}: {len(spans)} requests", file=sys.stderr)
        (logs / "stop").write_text("stop")
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    offs = [steps_of(logs, 0, a, b) for kind, a, b, _ in windows if kind == "off"]
    base = statistics.median(d for steps in offs for _s, d in steps)
    floor = abs(statistics.median(d for _s, d in offs[0]) - statistics.median(d for _s, d in offs[1])) / base
    rows = {kind: cost(steps_of(logs, 0, a, b), spans, base) for kind, a, b, spans in windows if kind != "off"}
    load_end = os.getloadavg()
    shutil.rmtree(work, ignore_errors=True)

    n = 10_000
    full_x = rows["full"]["excess_ms"] / 1000
    probe_x = rows["probe"]["excess_ms"] / 1000
    all_x = rows["full_all"]["excess_ms"] / 1000
    lines = [
        SECTION, "",
        "Written by `bench/fetch_cost.py` (method in its docstring); every number below comes from one run.", "",
        f"- Run started {started}; {platform.machine()}, `nproc` = {os.cpu_count()}; load average at start "
        f"{' / '.join(f'{v:.1f}' for v in load_start)}, at end {' / '.join(f'{v:.1f}' for v in load_end)}.",
        f"- Command: `.venv/bin/python bench/fetch_cost.py --phase {args.phase:g}`",
        f"- {RANKS} gloo ranks, fixed-compute steps (rank 0's step median {1000 * base:.2f} ms off), recorders "
        f"full (2,000 entries). Noise floor: the two 'off' windows' medians differ by {100 * floor:.1f}%.", "",
        "| action (one rank unless said) | requests | request ms (mean) | steps hit / steps | "
        "job's extra step time per request, ms |",
        "|---|---|---|---|---|",
    ]
    names = {"probe": "progress probe", "full": "full recorder (`fr_trace_json`)",
             "stacks": "stacks (`dump_traceback`)", "full_all": f"full recorder of all {RANKS} ranks at once"}
    for kind, row in rows.items():
        lines.append(f"| {names[kind]} | {row['requests']} | {row['request_ms']:.1f} | {row['hit']} / "
                     f"{row['steps']} | {row['excess_ms']:.1f} |")
    lines += [
        "", f"Model at {n:,} ranks (full read every 60 s per rank, probe every 10 s; method in the docstring):", "",
        "| step time | full reads at each rank's own moment | full reads on the same slot (schedule.py) | "
        "probes at own moments | probes on the same slot |",
        "|---|---|---|---|---|",
    ]
    for t in (0.5, 1.0, 5.0):
        lines.append(
            f"| {1000 * t:.0f} ms | {100 * slowdown_independent(full_x, n, t, 60):.2f}% | {100 * all_x / 60:.3f}% | "
            f"{100 * slowdown_independent(probe_x, n, t, 10):.2f}% | {100 * max(probe_x, 0) / 10:.3f}% |")
    aligned = 100 * (max(all_x, 0) / 60 + max(probe_x, 0) / 10)
    lines += [
        "", f"Every round on the same slot (the periodic full read and the probes between): {aligned:.2f}% of the "
        "job's time at any step length, from this run's costs; at each rank's own moments the same costs make "
        f"{100 * (slowdown_independent(full_x, n, 1.0, 60) + slowdown_independent(probe_x, n, 1.0, 10)):.2f}% "
        "at 1 s steps.",
        "",
        "How to read this: a read's cost is what the job loses, not what the rank spends: the step waits for "
        "the slowest rank. At 10,000 ranks with reads at independent moments almost every step holds one, so "
        "the job pays a read's delay nearly every step; on the wall clock's slots every rank's read of a "
        "period falls into one step (nodes' clocks agree within milliseconds), so the job pays it once a "
        "period. A negative number is below this machine's noise.",
        "",
        "Superseded by bench/rank_cost.py (\"Sidecar overhead\", per-action cost inside the rank): the "
        "costs above compare each phase's steps with the 'off' windows' median, so the machine's drift "
        "between phases (the noise floor above) lands in them; rank_cost.py interleaves the kinds, "
        "compares each request's steps with the steps around it, and measures the noise at placebo "
        "moments.",
    ]
    write_section(args.results, "\n".join(lines) + "\n", SECTION)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
