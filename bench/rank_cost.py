#!/usr/bin/env python3
"""What each sidecar action costs inside the rank, per step, and what that makes at 10,000 ranks.

What it runs: 4 gloo ranks of bench/rank_cost_train.py on loopback: fixed compute per step (8
matmuls of --size x --size on one thread, then one 64 KiB all_reduce), recorders full (2,000
entries), the worker-server socket and the `frscope_progress` handler from the sitecustomize
bootstrap. Every rank times its own steps and keeps them in memory (the script's docstring): end,
duration, compute part, the training thread's CPU, the process's CPU (all threads), and the
late wake-ups of a Python thread that sleeps 2 ms in a loop (GIL or CPU wait).

No sidecar runs: this script sends its requests with the sidecar's own `WorkerClient`, one at a
time at random moments (a gap of 0.5-1.5 x --gap seconds), the kind drawn from shuffled blocks of:

- `probe`: the progress probe (`frscope_progress`) of one random rank;
- `full`: the full recorder (`fr_trace_json`) of one random rank;
- `stacks`: `dump_traceback` of one random rank;
- `probe_all`, `full_all`: the same request to all 4 ranks at once (an aligned round: every rank of
  the job in the same moment, frscope/sidecar/schedule.py);
- `none`: nothing is sent (a placebo moment: the noise).

The kinds interleave over the whole run, so the machine's drift (2 shared cores, other people's
work) hits every kind alike.

What one action costs the job (X): the job's step is the interval between two of rank 0's step ends
(every all_reduce waits for the slowest rank). The steps that overlap the request, and the one
after it, are its window; X = the window's steps' time minus as many baseline steps, the baseline
being the median of the 25 job steps before and after the window (a paired, local comparison:
slow drift cancels). The same is done at every placebo moment with a window as long as a request of
the kind being compared (durations drawn from that kind's): the placebo's spread is the noise, and
X net = mean X - mean placebo X, +- 2 standard errors. Inside the rank, over the same window and
baseline: the CPU the request took (process CPU minus the training thread's: the worker server's
threads), the training thread's compute-phase delay, and the extra late-wake-up time of the GIL
probe thread (summed over the targeted ranks).

The model at N ranks: a synchronous step lasts as long as its slowest rank's. With each rank's
actions at moments of its own (once per period P), a step of T seconds holds at least one action
on some rank with probability 1 - exp(-N (T + d) / P) (d: the request's duration), and the job's
slowdown is that times X / T. With every rank's action of a period in the same moment (aligned),
the job pays one all-ranks action a period: X_all / P. Probes every poll interval (10 s), full reads
every --full-poll-every polls (6: 60 s); stacks are asked only at a stall or `?refresh=1`.

    .venv/bin/python bench/rank_cost.py                      # writes the subsection of bench/RESULTS.md
    .venv/bin/python bench/rank_cost.py --duration 60 --results /tmp/r.md   # quick look
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
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidecar_overhead import start_ranks, write_subsection

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Sidecar overhead"
HEADING = "### Per-action cost inside the rank, and the job's slowdown at 10,000 ranks"
RANKS = 4
KINDS = ("none", "probe", "full", "stacks", "probe_all", "full_all")
NAMES = {
    "probe": "progress probe (`frscope_progress`), one rank",
    "full": "full recorder (`fr_trace_json`), one rank",
    "stacks": "stacks (`dump_traceback`), one rank",
    "probe_all": f"progress probe, all {RANKS} ranks at once",
    "full_all": f"full recorder, all {RANKS} ranks at once",
}
BASE_STEPS = 25


@dataclass(frozen=True)
class Action:
    kind: str
    ranks: tuple[int, ...]
    start: float
    end: float


@dataclass
class Steps:
    """One rank's steps, in order: end wall time, duration, compute part, thread CPU, process CPU."""

    end: list[float]
    dur: list[float]
    compute: list[float]
    thread_cpu: list[float]
    proc_cpu: list[float]

    @classmethod
    def read(cls, path: Path) -> Steps:
        cols: list[list[float]] = [[], [], [], [], []]
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 5:
                for col, value in zip(cols, parts, strict=True):
                    col.append(float(value))
        return cls(*cols)


async def play(sockets: Path, seconds: float, gap: float, seed: int) -> list[Action]:
    from frscope.sidecar.client import WorkerClient

    rng = random.Random(seed)
    clients = {r: WorkerClient(sockets / f"rank-{r}.sock", timeout_s=30, max_bytes=256 << 20) for r in range(RANKS)}

    async def one(kind: str, rank: int) -> None:
        client = clients[rank]
        if kind.startswith("probe"):
            await client.probe("frscope_progress", "")
        elif kind.startswith("full"):
            await client.fr_trace_json()
        elif kind == "stacks":
            await client.dump_traceback(30, 1 << 20)

    actions: list[Action] = []
    block: list[str] = []
    end = time.time() + seconds
    try:
        while time.time() < end:
            await asyncio.sleep(rng.uniform(0.5, 1.5) * gap)
            if not block:
                block = list(KINDS)
                rng.shuffle(block)
            kind = block.pop()
            ranks = tuple(range(RANKS)) if kind.endswith("_all") else (rng.randrange(RANKS),)
            t0 = time.time()
            if kind != "none":
                await asyncio.gather(*(one(kind, r) for r in ranks))
            actions.append(Action(kind, ranks, t0, time.time()))
    finally:
        for c in clients.values():
            await c.close()
    return actions


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


class Job:
    def __init__(self, ranks: list[Steps], gil: list[list[tuple[float, float]]]) -> None:
        self.ranks = ranks
        n = min(len(r.end) for r in ranks)
        ends = ranks[0].end[:n]
        # The job's step i: from rank 0's end of step i-1 to its end of step i.
        self.ends = ends
        self.dur = [0.0] + [b - a for a, b in zip(ends, ends[1:], strict=False)]
        self.gil = [sorted(g) for g in gil]
        self.gil_t = [[t for t, _ in g] for g in self.gil]

    def window(self, start: float, end: float) -> tuple[int, int]:
        """Steps [i, j) that overlap [start, end], and the one after."""
        i = max(1, bisect_left(self.ends, start))  # first step ending after start
        j = min(len(self.ends), bisect_left(self.ends, end) + 2)
        return i, j

    def base_idx(self, i: int, j: int) -> list[int]:
        return [k for k in (*range(i - BASE_STEPS, i), *range(j, j + BASE_STEPS)) if 1 <= k < len(self.ends)]

    def cost(self, ranks: tuple[int, ...], start: float, end: float) -> dict[str, float] | None:
        i, j = self.window(start, end)
        base = self.base_idx(i, j)
        if j - i < 1 or len(base) < BASE_STEPS:
            return None
        n = j - i

        def extra(values: list[float]) -> float:
            return sum(values[i:j]) - n * statistics.median(values[k] for k in base)

        other = [[p - c for p, c in zip(r.proc_cpu, r.thread_cpu, strict=True)] for r in self.ranks]
        t_lo = self.ends[i - 1]
        t_hi = self.ends[j - 1]
        gil = 0.0
        for r in ranks:
            g, gt = self.gil[r], self.gil_t[r]
            inside = sum(d for _t, d in g[bisect_left(gt, t_lo):bisect_right(gt, t_hi)])
            b_lo, b_hi = self.ends[max(0, base[0] - 1)], self.ends[base[-1]]
            around = sum(d for _t, d in g[bisect_left(gt, b_lo):bisect_right(gt, b_hi)]) - inside
            gil += inside - around * (t_hi - t_lo) / max(1e-9, (b_hi - b_lo) - (t_hi - t_lo))
        return {
            "job": extra(self.dur),
            "cpu": sum(extra(other[r]) for r in ranks),
            "compute": max(extra(self.ranks[r].compute) for r in ranks),
            "thread_cpu": max(extra(self.ranks[r].thread_cpu) for r in ranks),
            "gil": gil,
            "steps": float(n),
        }


def summarize(values: list[float]) -> dict[str, float]:
    n = len(values)
    return {
        "n": n, "median": statistics.median(values), "p90": quantile(values, 0.9),
        "mean": statistics.fmean(values), "se": statistics.stdev(values) / math.sqrt(n) if n > 1 else float("nan"),
    }


def analyze(job: Job, actions: list[Action], seed: int) -> dict[str, Any]:
    rng = random.Random(seed + 1)
    placebo = [a for a in actions if a.kind == "none"]
    out: dict[str, Any] = {}
    for kind in KINDS[1:]:
        mine = [a for a in actions if a.kind == kind]
        costs = [c for a in mine if (c := job.cost(a.ranks, a.start, a.end)) is not None]
        durations = [a.end - a.start for a in mine]
        sham = []
        for a in placebo:
            d = rng.choice(durations)
            ranks = tuple(range(RANKS)) if kind.endswith("_all") else (rng.randrange(RANKS),)
            if (c := job.cost(ranks, a.start, a.start + d)) is not None:
                sham.append(c)
        row: dict[str, Any] = {"requests": len(mine), "request_ms": 1000 * statistics.median(durations),
               "request_p90_ms": 1000 * quantile(durations, 0.9)}
        for key in ("job", "cpu", "compute", "thread_cpu", "gil", "steps"):
            row[key] = summarize([c[key] for c in costs])
            row["placebo_" + key] = summarize([c[key] for c in sham])
            row["net_" + key] = row[key]["mean"] - row["placebo_" + key]["mean"]
            row["net_se_" + key] = math.hypot(row[key]["se"], row["placebo_" + key]["se"])
        out[kind] = row
    return out


def slowdown_own(x_s: float, d_s: float, n: int, step_s: float, period_s: float) -> float:
    """Each rank's action at a moment of its own, once a period: steps holding one pay X."""
    hit = 1 - math.exp(-n * (step_s + d_s) / period_s)
    return hit * max(x_s, 0.0) / step_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=420.0, help="seconds of requests")
    parser.add_argument("--gap", type=float, default=0.8, help="mean seconds between two requests")
    parser.add_argument("--size", type=int, default=128, help="matmul size of the fixed compute")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--poll-interval", type=float, default=10.0, help="for the model")
    parser.add_argument("--full-poll-every", type=int, default=6, help="for the model")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "RESULTS.md")
    parser.add_argument("--keep", action="store_true", help="keep the ranks' logs (printed path)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="frscope-rank-cost-"))
    sockets, logs = work / "sockets", work / "logs"
    sockets.mkdir()
    logs.mkdir()
    load_start = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    procs = start_ranks(RANKS, work, sockets, logs, "rank_cost_train.py", (str(args.size),))
    try:
        deadline = time.time() + 600
        while not all((logs / f"warm-{r}").exists() for r in range(RANKS)):
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit(f"ranks did not warm up; logs in {logs}")
            time.sleep(0.5)
        time.sleep(3)
        actions = asyncio.run(play(sockets, args.duration, args.gap, args.seed))
        time.sleep(2)
        (logs / "stop").write_text("stop")
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    ranks = [Steps.read(logs / f"steps-{r}.txt") for r in range(RANKS)]
    gil = []
    for r in range(RANKS):
        pairs = [line.split() for line in (logs / f"gil-{r}.txt").read_text().splitlines()]
        gil.append([(float(a), float(b)) for a, b in pairs])
    load_end = os.getloadavg()
    if args.keep:
        print(f"logs kept in {logs}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)

    job = Job(ranks, gil)
    t_first, t_last = actions[0].start, actions[-1].end
    in_run = [d for e, d in zip(job.ends, job.dur, strict=True) if t_first <= e <= t_last]
    step_s = statistics.median(in_run)
    rows = analyze(job, actions, args.seed)
    text = report(args, rows, step_s, len(in_run), started, load_start, load_end)
    write_subsection(args.results, text, HEADING, SECTION)
    print(text)
    return 0


def ms(v: float) -> str:
    return f"{1000 * v:.1f}"


def report(args: argparse.Namespace, rows: dict[str, Any], step_s: float, steps: int, started: str,
           load_start: tuple[float, float, float], load_end: tuple[float, float, float]) -> str:
    n = 10_000
    probe_every = args.poll_interval
    full_every = args.poll_interval * args.full_poll_every
    cmd = "bench/rank_cost.py" + (f" --duration {args.duration:g}" if args.duration != 420 else "")
    lines = [
        HEADING, "",
        "Written by `bench/rank_cost.py` (method in its docstring); every number below comes from one run.", "",
        f"- Run started {started}; {platform.machine()}, `nproc` = {os.cpu_count()}; load average at start "
        f"{' / '.join(f'{v:.1f}' for v in load_start)}, at end {' / '.join(f'{v:.1f}' for v in load_end)}.",
        f"- Command: `flock /work/heavy.lock .venv/bin/python {cmd}`",
        f"- {RANKS} gloo ranks, fixed-compute steps ({args.size}x{args.size} matmuls x 8, one 64 KiB all_reduce), "
        f"recorders full (2,000 entries); {steps} job steps during the requests, median {ms(step_s)} ms.",
        "",
        "Per action, what the job lost (X: its steps' time beyond the local baseline, over the steps the "
        "request overlapped and the one after) and what the rank spent. `placebo` is the same measure at "
        "moments when nothing was sent, with windows as long as that kind's requests: the noise. "
        "`net` = mean minus placebo mean, +- 2 standard errors.", "",
        "| action | requests | request ms, median (p90) | X ms: median / p90 / mean | placebo X ms: median / p90 / "
        "mean | X net ms | rank CPU ms, net (worker-server threads) | training thread's compute delay ms, net | "
        "GIL-probe lateness ms, net |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, row in rows.items():
        j, pj = row["job"], row["placebo_job"]
        lines.append(
            f"| {NAMES[kind]} | {row['requests']} | {row['request_ms']:.1f} ({row['request_p90_ms']:.1f}) | "
            f"{ms(j['median'])} / {ms(j['p90'])} / {ms(j['mean'])} | "
            f"{ms(pj['median'])} / {ms(pj['p90'])} / {ms(pj['mean'])} | "
            f"{ms(row['net_job'])} +- {ms(2 * row['net_se_job'])} | "
            f"{ms(row['net_cpu'])} +- {ms(2 * row['net_se_cpu'])} | "
            f"{ms(row['net_compute'])} +- {ms(2 * row['net_se_compute'])} | "
            f"{ms(row['net_gil'])} +- {ms(2 * row['net_se_gil'])} |")

    def x(kind: str, upper: bool) -> float:
        row = rows[kind]
        return max(0.0, float(row["net_job"]) + (2 * float(row["net_se_job"]) if upper else 0.0))

    def d(kind: str) -> float:
        return float(rows[kind]["request_ms"]) / 1000

    lines += [
        "", f"Model at {n:,} ranks: probe every {probe_every:g} s, full recorder every {full_every:g} s per rank "
        "(the defaults); X = X net (in brackets: X net + 2 standard errors); a negative X counts as 0. "
        "`own moments`: each rank's actions at moments of its own (the schedule before commit cff476b); "
        "`aligned`: every rank of the job in the same moment (the all-ranks X), one step a period.", "",
        "| step time | probes, own moments | full reads, own moments | total, own moments | probes, aligned | "
        "full reads, aligned | total, aligned |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in (0.25, 0.5, 1.0, 5.0):
        own = [[slowdown_own(x(k, u), d(k), n, t, p) for u in (False, True)]
               for k, p in (("probe", probe_every), ("full", full_every))]
        al = [[x(k, u) / p for u in (False, True)] for k, p in (("probe_all", probe_every), ("full_all", full_every))]
        cells = [own[0], own[1], [own[0][0] + own[1][0], own[0][1] + own[1][1]],
                 al[0], al[1], [al[0][0] + al[1][0], al[0][1] + al[1][1]]]
        shown = " | ".join(f"{100 * a:.2f}% ({100 * b:.2f}%)" for a, b in cells)
        lines.append(f"| {1000 * t:.0f} ms | {shown} |")
    own_1s = sum(slowdown_own(x(k, False), d(k), n, 1.0, p) for k, p in (("probe", probe_every), ("full", full_every)))
    aligned = x("probe_all", False) / probe_every + x("full_all", False) / full_every
    aligned_hi = x("probe_all", True) / probe_every + x("full_all", True) / full_every
    lines += [
        "",
        f"In one line: at {n:,} ranks and 1 s steps, reads at each rank's own moments cost the job "
        f"{100 * own_1s:.2f}% of its time; on the job's common slots {100 * aligned:.2f}% at any step length "
        f"({100 * aligned_hi:.2f}% with each X at its mean + 2 standard errors); target <= 0.5%.",
        "",
        "How to read this: X is what the job loses, not what the rank spends (the rank CPU column): a "
        "step waits for its slowest rank, so a request that delays one rank delays every rank's step about "
        "as much. At 10,000 ranks with requests at each rank's own moments almost every step "
        "holds one (10,000 x 1 s / 60 s = 167 full reads in flight per 1 s step), so the job pays X nearly "
        "every step; on the job's common slots every rank's request of a period falls into the same step, "
        "and the job pays one all-ranks X a period. The all-ranks X here is pessimistic: 4 ranks and the "
        "requester share 2 cores, where on a training node each rank has cores of its own. What the "
        "aligned step pays is the slowest of the ranks' delays; that the delays add no more than X to the "
        "slowest rank's needs them to be a CPU cost of about the same size on every rank (they are: the "
        "same recorder size, the same code), and the nodes' clocks to agree to well below a step (NTP: "
        "milliseconds). Not on the slots: a rank's first read, and the read of a suspected stall (the job "
        "is not progressing then). Stacks are not periodic (a stall or `?refresh=1` only), so they are "
        "not in the model.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
