#!/usr/bin/env python3
"""What dating every collective costs a training step: frscope's bootstrap with its collective timer
on (`frscope_timings`: torch 2.14+'s process-group hooks, or the wrapped Python collectives on 2.13)
against the same bootstrap with the timer off (FRSCOPE_TIMINGS=0: the worker server alone, so the
difference is the timer's own cost).

What it runs: --ranks gloo ranks on loopback of frscope/testing/timed_train.py (an MLP, forward and
backward, the gradients all-reduced as one bucket each step, a broadcast every 10 steps; `--ddp`:
torch's DistributedDataParallel), --steps measured steps after --warmup, for each case below, in
--rounds rounds with the order of "off" and "on" alternating. No sidecar reads the ranks (its cost is
bench/sidecar_overhead.py's). Cases:
- "training step": width 512, batch 64 (a few ms of compute per step);
- "collective-bound step": width 8, batch 1 (almost nothing but the all_reduce: the timer's cost per
  collective, as an upper bound on its share).
Reported: per case, the median of each run's median step time, on and off, the difference (in % and
in microseconds per step), the spread between runs of the same setting (the noise floor), and the
CPU time per step of rank 0's whole process (every thread, gloo's included: where the timer's
callbacks run), which the machine's load disturbs less than wall time.

    .venv/bin/python bench/timing_overhead.py                                  # torch 2.13 (this venv)
    .venv/bin/python bench/timing_overhead.py --python ~/.cache/frscope-torch/2.15.0/bin/python --ddp
    .venv/bin/python bench/timing_overhead.py --rounds 2 --results /tmp/r.md    # quick look

Writes (or replaces) the section of --results named after the torch version and mode; the rest is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "frscope" / "testing" / "timed_train.py"
BOOTSTRAP = REPO / "frscope" / "sidecar" / "bootstrap"
CASES = {"training step": ["--width", "512", "--batch", "64"],
         "collective-bound step": ["--width", "8", "--batch", "1"]}
# --micro: one rank (a gloo group of 1), batches of all_reduces of one float, the timer switched on and
# off between batches in the same process (torch 2.14+: the group's hooks registered and removed;
# older torch: `all_reduce` swapped for its wrapper and back): the timer's own cost per collective, with
# the machine's drift cancelled pair by pair.
MICRO = """
import json, statistics, sys, time, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[3])
import _frscope_timings as ft
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
c10d = sys.modules["torch.distributed.distributed_c10d"]
pg, t, n, rounds = dist.group.WORLD, torch.ones(1), int(sys.argv[2]), int(sys.argv[4])
timer = ft.Timings(2000)
hooks = hasattr(pg, "register_pre_hook")
# what install() does: on 2.14+ the group's hooks and the Python collectives marked (`returning`),
# before that the Python collectives wrapped
original = c10d.all_reduce
wrapped = timer.returning(c10d, "all_reduce") if hooks else timer.wrap(c10d, "all_reduce")

def switch(on):
    c10d.all_reduce = wrapped if on else original
    if hooks and on:
        timer.attach(pg)
    elif hooks:
        pg.unregister_pre_hook(ft.HOOK_ID)
        pg.unregister_post_hook(ft.HOOK_ID)
        timer.attached.discard(pg)

def batch():
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        c10d.all_reduce(t)
    return (time.process_time() - c0) / n * 1e6, (time.perf_counter() - w0) / n * 1e6

for _ in range(2000):
    c10d.all_reduce(t)
runs = {False: [], True: []}
for r in range(rounds):
    for on in ((False, True) if r % 2 == 0 else (True, False)):
        switch(on)
        runs[on].append(batch())
switch(False)
pairs = list(zip(runs[False], runs[True]))
med = statistics.median
print(json.dumps({"mechanism": "pg_hooks" if hooks else "wrappers",
                  "cpu_off": med(c for c, _ in runs[False]), "cpu_on": med(c for c, _ in runs[True]),
                  "wall_off": med(w for _, w in runs[False]), "wall_on": med(w for _, w in runs[True]),
                  "cpu_cost": statistics.median(on[0] - off[0] for off, on in pairs),
                  "wall_cost": statistics.median(on[1] - off[1] for off, on in pairs)}))
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(python: str, ranks: int, extra: list[str], timings_on: bool,
            socket_dir: Path) -> tuple[list[float], float]:
    """One job; rank 0's measured step times (s) and its CPU time over them (s)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRSCOPE_", "TORCHELASTIC_", "PET_"))}
    env.update(PYTHONPATH=str(BOOTSTRAP), FRSCOPE_SOCKET_DIR=str(socket_dir),
               FRSCOPE_TIMINGS="1" if timings_on else "0",
               WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               TORCH_FR_BUFFER_SIZE="2000")
    procs = [subprocess.Popen([python, "-W", "ignore", str(TRAIN), *extra], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(ranks)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"a rank failed ({p.returncode}):\n{err[-3000:]}")
    line = [ln for ln in outs[0][0].splitlines() if ln.startswith("{")][-1]
    doc = json.loads(line)
    return [float(s) for s in doc["step_s"]], float(doc["cpu_s"])


def micro(args: argparse.Namespace, version: str) -> None:
    """The timer's own cost per collective (--micro), its own section."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRSCOPE_", "TORCHELASTIC_", "PET_"))}
    env.update(OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="2000")
    env.pop("PYTHONPATH", None)
    out = subprocess.run([args.python, "-W", "ignore", "-c", MICRO, str(free_port()), str(args.micro_ops),
                          str(BOOTSTRAP), str(args.rounds)], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"the micro run failed ({out.returncode}):\n{out.stderr[-3000:]}")
    got = json.loads(out.stdout.splitlines()[-1])
    command = " ".join(["bench/timing_overhead.py", *sys.argv[1:]])
    heading = f"## Collective durations: the timer's cost per collective (torch {version})"
    lines = [heading, "", f"- Command: `.venv/bin/python {command}`",
             f"- One rank (a gloo group of 1), {args.rounds} batches of {args.micro_ops:,} `all_reduce`s of one "
             f"float with the timer on and as many with it off ({got['mechanism']}), switched between batches "
             "in one process (alternating order); the cost is the median of the pairs' differences. "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average (1 min) {os.getloadavg()[0]:.1f}",
             "", "| per all_reduce | timer off (median batch) | timer on | the timer's cost (median of pairs) |",
             "|---|---:|---:|---:|",
             f"| CPU (every thread of the process) | {got['cpu_off']:.2f} us | {got['cpu_on']:.2f} us | "
             f"{got['cpu_cost']:+.2f} us |",
             f"| wall | {got['wall_off']:.2f} us | {got['wall_on']:.2f} us | {got['wall_cost']:+.2f} us |", ""]
    write_section(args.results, heading, "\n".join(lines))


def write_section(results: Path, heading: str, section: str) -> None:
    text = results.read_text() if results.exists() else ""
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    results.write_text(text)
    print(section)


def torch_version(python: str) -> str:
    out = subprocess.run([python, "-W", "ignore", "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="the trainer's interpreter (a torch venv)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--ddp", action="store_true", help="torch's DistributedDataParallel (its C++ reducer)")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "RESULTS.md")
    parser.add_argument("--micro", action="store_true", help="the timer's cost per collective instead")
    parser.add_argument("--micro-ops", type=int, default=2_000, help="all_reduces per --micro batch")
    args = parser.parse_args()

    version = torch_version(args.python)
    if args.micro:
        micro(args, version)
        return
    mode = "DDP" if args.ddp else "all_reduce of one flat bucket"
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    results: dict[str, dict[bool, list[float]]] = {case: {False: [], True: []} for case in CASES}
    cpu: dict[str, dict[bool, list[float]]] = {case: {False: [], True: []} for case in CASES}
    with tempfile.TemporaryDirectory(prefix="frscope-timing-bench-") as tmp:
        for rnd in range(args.rounds):
            for case, extra in CASES.items():
                order = (False, True) if rnd % 2 == 0 else (True, False)
                for on in order:
                    argv = [*extra, "--steps", str(args.steps), "--warmup", str(args.warmup)]
                    steps, cpu_s = run_job(args.python, args.ranks, argv + (["--ddp"] if args.ddp else []), on,
                                           Path(tmp))
                    med = statistics.median(steps)
                    results[case][on].append(med)
                    cpu[case][on].append(cpu_s / len(steps))
                    print(f"round {rnd + 1} {case} timer {'on' if on else 'off'}: median step {med * 1e3:.3f} ms",
                          flush=True)
    load_after = os.getloadavg()

    command = " ".join(["bench/timing_overhead.py", *sys.argv[1:]])
    lines = [f"## Collective durations: the timer's cost to training (torch {version}, {mode})", "",
             f"- Command: `.venv/bin/python {command}`",
             f"- Machine: {platform.machine()}, `nproc` = {os.cpu_count()}, Python {platform.python_version()}, "
             f"torch {version}; run {started}; load average (1 min) {load_before[0]:.1f} at start, "
             f"{load_after[0]:.1f} at end (a machine shared with other engineers' builds and tests)",
             f"- {args.ranks} gloo ranks on loopback, frscope/testing/timed_train.py, {args.steps} measured steps "
             f"after {args.warmup}, {args.rounds} rounds alternating off/on; off = FRSCOPE_TIMINGS=0 (the "
             "bootstrap's worker server alone), on = the collective timer too", "",
             "| case | wall step off (median of runs) | on | difference | runs off (min-max) | runs on (min-max) | "
             "CPU per step off | on | difference |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for case, got in results.items():
        off, on = statistics.median(got[False]), statistics.median(got[True])
        c_off, c_on = statistics.median(cpu[case][False]), statistics.median(cpu[case][True])
        lines.append(f"| {case} | {off * 1e3:.3f} ms | {on * 1e3:.3f} ms | {100 * (on - off) / off:+.2f}% "
                     f"({(on - off) * 1e6:+.1f} us) | {min(got[False]) * 1e3:.3f}-{max(got[False]) * 1e3:.3f} ms | "
                     f"{min(got[True]) * 1e3:.3f}-{max(got[True]) * 1e3:.3f} ms | {c_off * 1e3:.3f} ms | "
                     f"{c_on * 1e3:.3f} ms | {100 * (c_on - c_off) / c_off:+.2f}% ({(c_on - c_off) * 1e6:+.1f} us) |")
    lines.append("")
    write_section(args.results, lines[0], "\n".join(lines))


if __name__ == "__main__":
    main()
