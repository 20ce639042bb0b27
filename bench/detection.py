#!/usr/bin/env python3
"""Detection: how fast a real hang is suspected and its culprit named, how often healthy jobs with
long pauses are suspected, how fast a straggler is reported, with the sidecar's default flags.

What it runs (real gloo jobs on loopback, frscope.testing.rhythm_job through the zero-code bootstrap,
one real `frscope sidecar` process per pod with its defaults: probe every 2 s, full recorder every
30 s, suspected after 4-15 s by each group's rhythm, --stall-after 60 s):
  - hangs: 4 ranks in 2 pods of 2, steps of --step-periods seconds (2 all_reduces each, 10% jitter);
    at a random step about 25-30 s in (the sidecars are up and have seen the job's rhythm; at least
    the 6th step) a random rank stops at a random point of its compute, in a Python function.
    Measured from that moment (the rank writes it): *suspected*, the first /v1/status of any pod
    that says so (read every 0.25 s); *named*, when the snapshots gathered then from every sidecar,
    as the operator gathers them, analyzed by frscope.analysis (the operator's code), name that
    rank (RankNotJoined).
  - healthy: 4 ranks in 2 pods, --healthy-minutes each, steps of 0.2, 1 and 3 s with 30% jitter,
    every ~60 s every rank checkpoints 30-45 s (nothing in flight), evaluation phases (10 steps of
    half the compute). Counted: suspicions (a pod's status turning suspected), confirmed stalls,
    straggler reports.
  - stragglers: 3 ranks in one pod (a sidecar compares its pod's ranks), steps of 0.25-1 s with 10%
    jitter; after ~30 s one rank computes 1.2, 1.5 or 2 x as long. Measured from its first slow step
    to the pod's status naming it a straggler; any other rank named is a false report.

    .venv/bin/python bench/detection.py                      # the full run (about 15 min), writes RESULTS.md
    .venv/bin/python bench/detection.py --hangs 6 --healthy-minutes 2 --stragglers 3 --results /tmp/d.md

Only the "## Detection" section of the results file is written; the rest is kept.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sidecar_overhead import write_section  # noqa: E402

from frscope.analysis import AnalysisOptions, Category, analyze  # noqa: E402
from frscope.records import assemble, normalize_dump  # noqa: E402
from frscope.testing.rhythm_launch import RhythmJob, start_rhythm_job  # noqa: E402

SECTION = "## Detection"


class Sidecar:
    """`frscope sidecar` with its default flags, serving one pod's socket dir."""

    def __init__(self, sockets: Path, work: Path, name: str) -> None:
        self.port_file = work / f"{name}.port"
        self.log = open(work / f"{name}.log", "ab")  # closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(sockets), "--evidence-dir", "none",
             "--host", "127.0.0.1", "--port", "0", "--port-file", str(self.port_file), "--pod", name],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=work,
        )
        deadline = time.monotonic() + 90
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sidecar did not start: see {work / name}.log")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=20) as resp:
            body = bytes(resp.read())
            return gzip.decompress(body) if resp.headers.get("Content-Encoding") == "gzip" else body

    def status(self) -> dict[str, Any]:
        got: dict[str, Any] = json.loads(self.get("/v1/status"))
        return got

    def metric(self, name: str) -> float:
        total = 0.0
        for line in self.get("/metrics").decode().splitlines():
            if line.startswith(name):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


def sidecars_for(job: RhythmJob) -> list[Sidecar]:
    job.wait_for_sockets(180)
    return [Sidecar(path, job.work_dir, f"pod{pod}") for pod, path in sorted(job.pods.items())]


@dataclass
class HangRun:
    step_s: float
    culprit: int
    suspected_s: float | None = None
    named_s: float | None = None
    first_named: str = ""  # what the first analysis after the suspicion named
    note: str = ""


def run_hang(index: int, step_s: float, seed: int) -> HangRun:
    rng = random.Random(seed)
    culprit = rng.randrange(4)
    run = HangRun(step_s, culprit)
    args = ["--steps", "100000", "--step-s", str(step_s), "--jitter-s", str(step_s / 10), "--culprit", str(culprit),
            "--hang-step", str(max(6, int(25 / step_s)) + rng.randint(0, 5)), "--seed", str(seed)]
    with start_rhythm_job(4, 2, args, lifetime_s=600) as job:
        sidecars = sidecars_for(job)
        try:
            hang_ns = None
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                hang_ns = hang_ns or job.hang_started_ns()
                if hang_ns is not None and time.time_ns() - hang_ns > 90e9:
                    run.note = "not suspected within 90 s"
                    break
                statuses = [s.status() for s in sidecars]
                if any(st.get("suspected") for st in statuses):
                    now = time.time_ns()
                    if hang_ns is None:
                        run.note = "suspected before the hang (a false alarm)"
                        break
                    run.suspected_s = (now - hang_ns) / 1e9
                    run.named_s, run.first_named = name_culprit(sidecars, culprit, hang_ns)
                    break
                time.sleep(0.25)
        finally:
            for sidecar in sidecars:
                sidecar.stop()
    print(f"hang {index}: step {step_s:g} s, culprit {culprit}: suspected {run.suspected_s}, named {run.named_s} "
          f"({run.first_named}) {run.note}", flush=True)
    return run


def name_culprit(sidecars: list[Sidecar], culprit: int, hang_ns: int) -> tuple[float | None, str]:
    """Gather every sidecar's snapshot and analyze, as the operator does, until the culprit is named
    (at most 30 s); (seconds from the hang, what the first analysis said)."""
    first = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        dumps = []
        for sidecar in sidecars:
            snap = json.loads(sidecar.get("/v1/snapshot?entries=200"))
            for piece in snap["ranks"]:
                dumps.append(normalize_dump(piece, f"{snap['pod']}:{piece['rank']}", piece["rank"]))
        report = analyze(assemble(dumps, []), AnalysisOptions(stall_after_s=2.0))
        root = report.findings[0] if report.findings else None
        said = f"{root.category.value} {list(root.culprit_ranks)}" if root else "nothing"
        first = first or said
        if root is not None and root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (culprit,):
            return (time.time_ns() - hang_ns) / 1e9, first
        time.sleep(0.5)
    return None, first


@dataclass
class HealthyRun:
    step_s: float
    minutes: float
    suspicions: int = 0
    suspected_s: list[float] = field(default_factory=list)  # how long each lasted
    resumed: float = 0.0
    confirmed: float = 0.0
    stragglers: list[str] = field(default_factory=list)
    polls: int = 0
    seen: list[str] = field(default_factory=list)  # at each suspicion: the suspected groups, the ranks' phases


def run_healthy(step_s: float, minutes: float, seed: int) -> HealthyRun:
    run = HealthyRun(step_s, minutes)
    every = max(5, int(60 / (step_s * 1.15)))
    args = ["--steps", "1000000", "--step-s", str(step_s), "--jitter-s", str(step_s * 0.3), "--pause-every",
            str(every), "--pause-s", "30", "--pause-max-s", "45", "--eval-every", str(max(3, every // 2 + 1)),
            "--eval-steps", "10", "--seed", str(seed)]
    with start_rhythm_job(4, 2, args, lifetime_s=minutes * 60 + 300) as job:
        sidecars = sidecars_for(job)
        try:
            end = time.monotonic() + minutes * 60
            was = [False] * len(sidecars)
            since = [0.0] * len(sidecars)
            while time.monotonic() < end:
                for i, sidecar in enumerate(sidecars):
                    st = sidecar.status()
                    now = bool(st.get("suspected"))
                    if now and not was[i]:
                        run.suspicions += 1
                        since[i] = time.monotonic()
                        groups = [f"rank {r} {pg}: {g.get('inflight_op')} #{g.get('inflight_seq')} quiet "
                                  f"{g.get('no_progress_s')} s (usual wait {g.get('usual_wait_s')} s)"
                                  for r, doc in st["ranks"].items() for pg, g in doc["groups"].items()
                                  if g.get("suspected")]
                        phases = ", ".join(f"rank {r}: {p} for {s:.1f} s" for r, (p, s) in sorted(job.phases().items()))
                        run.seen.append(f"{'; '.join(groups)} [{phases}]")
                        print(f"healthy {step_s:g} s: suspected: {run.seen[-1]}", flush=True)
                    elif was[i] and not now:
                        run.suspected_s.append(time.monotonic() - since[i])
                    was[i] = now
                    for rank, doc in st["ranks"].items():
                        if (doc.get("lateness") or {}).get("straggler"):
                            run.stragglers.append(f"{sidecar.port}:{rank}")
                run.polls += 1
                time.sleep(0.5)
            assert all(job.alive(r) for r in job.ranks()), job.log_tail(0)
            run.resumed = sum(s.metric('frscope_suspected_stalls_total{outcome="resumed"}') for s in sidecars)
            run.confirmed = sum(s.metric("frscope_stalls_total") for s in sidecars)
        finally:
            for sidecar in sidecars:
                sidecar.stop()
    print(f"healthy {step_s:g} s x {minutes:g} min: {run.suspicions} suspicions, {run.confirmed:g} confirmed, "
          f"{len(set(run.stragglers))} straggler reports", flush=True)
    return run


@dataclass
class StragglerRun:
    factor: float
    step_s: float
    culprit: int
    reported_s: float | None = None
    wrong: list[int] = field(default_factory=list)


def run_straggler(index: int, factor: float, step_s: float, seed: int) -> StragglerRun:
    rng = random.Random(seed)
    culprit = rng.randrange(3)
    run = StragglerRun(factor, step_s, culprit)
    slow_from = int(30 / step_s)
    args = ["--steps", "100000", "--step-s", str(step_s), "--jitter-s", str(step_s / 10), "--culprit", str(culprit),
            "--slow-factor", str(factor), "--slow-from-step", str(slow_from), "--seed", str(seed)]
    with start_rhythm_job(3, 3, args, lifetime_s=600) as job:
        (sidecar,) = sidecars_for(job)
        try:
            deadline = time.monotonic() + 400
            while time.monotonic() < deadline:
                started = job.slow_started_ns()
                st = sidecar.status()
                named = [int(r) for r, doc in st["ranks"].items() if (doc.get("lateness") or {}).get("straggler")]
                run.wrong.extend(r for r in named if r != culprit and r not in run.wrong)
                if culprit in named and started is not None:
                    run.reported_s = (time.time_ns() - started) / 1e9
                    break
                if started is not None and time.time_ns() - started > 180e9:
                    break
                time.sleep(0.5)
        finally:
            sidecar.stop()
    print(f"straggler {index}: {factor:g} x, step {step_s:g} s, rank {culprit}: reported after {run.reported_s} s, "
          f"wrong {run.wrong}", flush=True)
    return run


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(hangs: list[HangRun], healthy: list[HealthyRun], stragglers: list[StragglerRun], command: str,
            wall_s: float) -> str:
    lines = [SECTION, "", f"Command: `{command}` ({wall_s / 60:.1f} min wall, {platform.node()}, "
             f"{platform.processor() or platform.machine()}; the machine's 2 cores shared with other work, "
             "load average above 10 during the run)", ""]
    suspected = [h.suspected_s for h in hangs if h.suspected_s is not None]
    named = [h.named_s for h in hangs if h.named_s is not None]
    lines.append(f"### Hangs ({len(hangs)}: one rank stuck in Python at a random phase, 4 ranks in 2 pods)")
    lines.append("")
    lines.append("| step period | runs | hang -> suspected p50 / p90 / max (s) "
                 "| hang -> culprit named p50 / p90 / max (s) |")
    lines.append("|---|---|---|---|")
    for step in sorted({h.step_s for h in hangs}):
        mine = [h for h in hangs if h.step_s == step]
        s = [h.suspected_s for h in mine if h.suspected_s is not None]
        n = [h.named_s for h in mine if h.named_s is not None]
        fs = f"{pct(s, .5):.1f} / {pct(s, .9):.1f} / {max(s):.1f}" if s else "-"
        fn = f"{pct(n, .5):.1f} / {pct(n, .9):.1f} / {max(n):.1f}" if n else "-"
        lines.append(f"| {step:g} s | {len(mine)} | {fs} | {fn} |")
    if suspected and named:
        lines.append(f"| all | {len(hangs)} | {pct(suspected, .5):.1f} / {pct(suspected, .9):.1f} / "
                     f"{max(suspected):.1f} | {pct(named, .5):.1f} / {pct(named, .9):.1f} / {max(named):.1f} |")
    missed = [h for h in hangs if h.named_s is None]
    lines.append("")
    lines.append(f"Culprit named correctly in {len(named)} of {len(hangs)} hangs; the first analysis after the "
                 f"suspicion named it in {sum(1 for h in hangs if h.first_named.startswith('RankNotJoined'))}."
                 + (" Missed: " + "; ".join(f"step {h.step_s:g} s: {h.note or h.first_named}" for h in missed)
                    if missed else ""))
    lines.append("")
    total_min = sum(h.minutes for h in healthy)
    lines.append(f"### Healthy jobs with long pauses ({total_min:g} min in all)")
    lines.append("")
    lines.append("| step period | minutes | suspicions (all pauses have nothing in flight) "
                 "| how long they lasted (s) | confirmed stalls | straggler reports |")
    lines.append("|---|---|---|---|---|---|")
    for h in healthy:
        lasted = ", ".join(f"{d:.1f}" for d in h.suspected_s) or "-"
        lines.append(f"| {h.step_s:g} s | {h.minutes:g} | {h.suspicions} | {lasted} | {h.confirmed:g} | "
                     f"{len(set(h.stragglers))} |")
    for h in healthy:
        for seen in h.seen:
            lines.append(f"- {h.step_s:g} s job, suspected: {seen}")
    lines.append("")
    lines.append(f"### Stragglers ({len(stragglers)}: 3 ranks in one pod)")
    lines.append("")
    lines.append("| factor | runs | slow -> reported p50 / max (s) | not reported within 180 s | other ranks named |")
    lines.append("|---|---|---|---|---|")
    for factor in sorted({s.factor for s in stragglers}):
        runs = [r for r in stragglers if r.factor == factor]
        got = [r.reported_s for r in runs if r.reported_s is not None]
        fr = f"{pct(got, .5):.1f} / {max(got):.1f}" if got else "-"
        lines.append(f"| {factor:g} x | {len(runs)} | {fr} | {sum(1 for r in runs if r.reported_s is None)} | "
                     f"{sum(len(r.wrong) for r in runs)} |")
    right = sum(1 for r in stragglers if r.reported_s is not None)
    wrong = sum(len(r.wrong) for r in stragglers) + sum(len(set(h.stragglers)) for h in healthy)
    if right + wrong:
        lines.append("")
        share = 100 * right / (right + wrong)
        lines.append(f"Straggler precision: {right} right of {right + wrong} reports ({share:.0f}%).")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hangs", type=int, default=30)
    parser.add_argument("--step-periods", default="0.1,0.25,0.5,1,2,5")
    parser.add_argument("--healthy-minutes", type=float, default=11.0)
    parser.add_argument("--stragglers", type=int, default=9)
    parser.add_argument("--parallel", type=int, default=3, help="hang and straggler runs at once")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results", default=str(REPO / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    periods = [float(p) for p in args.step_periods.split(",")]
    started = time.monotonic()
    healthy: list[HealthyRun] = []
    healthy_threads = [
        threading.Thread(target=lambda s=step, i=i: healthy.append(run_healthy(s, args.healthy_minutes, args.seed + i)))
        for i, step in enumerate((0.2, 1.0, 3.0))
    ] if args.healthy_minutes > 0 else []
    for thread in healthy_threads:
        thread.start()
    with ThreadPoolExecutor(args.parallel) as pool:
        hang_futures = [pool.submit(run_hang, i, periods[i % len(periods)], args.seed * 1000 + i)
                        for i in range(args.hangs)]
        factors = (1.2, 1.5, 2.0)
        steps = (0.25, 0.5, 1.0)
        straggler_futures = [pool.submit(run_straggler, i, factors[i % 3], steps[(i // 3) % 3], args.seed * 2000 + i)
                             for i in range(args.stragglers)]
        hangs = [f.result() for f in hang_futures]
        stragglers = [f.result() for f in straggler_futures]
    for thread in healthy_threads:
        thread.join()
    command = "python bench/detection.py " + " ".join(sys.argv[1:])
    text = summary(hangs, healthy, stragglers, command.strip(), time.monotonic() - started)
    print(text)
    write_section(Path(args.results), text, SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
