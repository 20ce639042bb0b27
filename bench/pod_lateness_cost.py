#!/usr/bin/env python3
"""What comparing a job's pods costs the operator at large rank counts: one status sweep's answers
merged into the job's arrivals and compared (engine/pod_stragglers.compare, the function the operator
runs in a worker thread), and reading one pod's /v1/status answer with its arrivals (wire.loads_status).

Synthetic input (frscope.testing.lateness_jobs: a lockstep job, 10% of the step as jitter, one rank
1.5 x slow; each pod's clock off by up to 1 s and measured within 1 ms): the recorders' arrivals as the
sidecars would report them, each sweep carrying each rank's newest wire.STATUS_ARRIVALS per group
(within the document's total), 15 s of steps apart (the operator's default --poll-interval). Timed:
the sweeps after the first few (the merge at steady state), CPU time of this one thread; peak memory
of the job's arrivals (tracemalloc). The status answer is the JSON a sidecar of 8 ranks writes.

    .venv/bin/python bench/pod_lateness_cost.py            # writes the section of bench/RESULTS.md
    .venv/bin/python bench/pod_lateness_cost.py --results /tmp/c.md

Only the "## Lateness across pods: operator cost" section of the results file is written.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sidecar_overhead import write_section  # noqa: E402

from frscope import wire  # noqa: E402
from frscope.operator.engine.job_arrivals import JobArrivals  # noqa: E402
from frscope.operator.engine.pod_stragglers import compare  # noqa: E402
from frscope.testing.lateness_jobs import LatenessJob, pods_of, simulate  # noqa: E402

SECTION = "## Lateness across pods: operator cost"
STEP_S = 0.25  # two collectives a step (subgroups of the layout aside): 8 a second


def sweeps(world: int, per_pod: int, count: int) -> tuple[list[dict[str, wire.SidecarStatus]], str]:
    """`count` sweeps' answers of a job (15 s of steps apart), and the slow rank's pod."""
    pods = pods_of(world, per_pod)
    steps = int(count * 15 / STEP_S) + 64
    slow = world // 3
    job = LatenessJob(pods, STEP_S, steps, slow={slow: 1.5}, jitter=0.03, subgroups=0, seed=world,
                      offsets_s={p: (i % 200 - 100) / 100 for i, p in enumerate(pods)})
    arrivals = simulate(job)
    per_step = 1
    out: list[dict[str, wire.SidecarStatus]] = []
    for k in range(1, count + 1):
        upto = int(k * 15 / STEP_S) * per_step + 64
        sweep = {}
        for pod, by_rank in arrivals.items():
            each = wire.status_arrivals_each(len(by_rank))
            rows = {r: {g: tuple(rs[max(0, upto - each):upto]) for g, rs in groups.items()}  # rs[i]: seq i + 1
                    for r, groups in by_rank.items()}
            offset = int(job.offsets_s[pod] * 1e9)
            asked = 10**18 + k * 15 * 10**9
            sweep[pod] = wire.SidecarStatus(pod=pod, namespace="ml", stalled=False, stalls=(), ranks_up=len(by_rank),
                                            ranks_down=0, arrivals=rows, answered_at_ns=asked + 500_000 + offset,
                                            asked_ns=asked, received_ns=asked + 1_000_000)
        out.append(sweep)
    slow_pod = next(p for p, members in pods.items() if slow in members)
    return out, slow_pod


def measure(world: int, per_pod: int, count: int = 6) -> dict[str, object]:
    answers, slow_pod = sweeps(world, per_pod, count)
    pods = set(answers[0])
    arrivals = JobArrivals()
    tracemalloc.start()
    times: list[float] = []
    found = {}
    for k, sweep in enumerate(answers):
        started = time.thread_time()
        found = compare(arrivals, sweep, pods, 0.02, 10**18 + (k + 1) * 15 * 10**9 + 2_000_000)
        times.append(time.thread_time() - started)
    _now, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    named = sorted(p for p, late in found.items() if late.straggler)
    steady = times[2:]
    return {"world": world, "per_pod": per_pod, "pods": len(pods), "cpu_s": sum(steady) / len(steady),
            "max_s": max(steady), "peak_mb": peak / 2**20, "named": named, "slow_pod": slow_pod,
            "compared": found[slow_pod].compared if slow_pod in found else 0}


def status_read() -> tuple[float, int]:
    """Seconds to read one 8-rank sidecar's /v1/status answer with its arrivals; its size in bytes."""
    ranks = {}
    for r in range(8):
        rows = [[seq, 1_700_000_000_000_000_000 + seq * 125_000_000, 3_000_000 + seq] for seq in range(1, 257)]
        ranks[str(r)] = {"up": True, "groups": {"0": {"stalled": False, "arrivals": rows}}}
    raw = json.dumps({"schema": wire.STATUS_SCHEMA, "pod": "p", "namespace": "ml", "captured_at_ns": 1,
                      "answered_at_ns": 2, "stalled": False, "ranks": ranks}).encode()
    started = time.perf_counter()
    for _ in range(20):
        replace(wire.loads_status(raw))
    return (time.perf_counter() - started) / 20, len(raw)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(REPO / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    rows = [measure(w, p) for w, p in ((64, 8), (1024, 8), (8192, 8), (8192, 1))]
    read_s, size = status_read()
    lines = [SECTION, "", f"Command: `python bench/pod_lateness_cost.py` ({platform.node()}, "
             f"{platform.processor() or platform.machine()}; the machine's 2 cores shared with other work). "
             "Synthetic input (frscope.testing.lateness_jobs), as the sidecars would report it: one rank 1.5 x slow, "
             "3% jitter, each pod's clock up to 1 s off, 15 s of 0.25 s steps between sweeps.", "",
             "| ranks | ranks a pod | pods | merge + compare per sweep, CPU s (mean / max) | peak memory (MiB) "
             "| collectives compared | named |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        named = "the slow rank's pod" if r["named"] == [r["slow_pod"]] else str(r["named"])
        lines.append(f"| {r['world']} | {r['per_pod']} | {r['pods']} | {r['cpu_s']:.2f} / {r['max_s']:.2f} | "
                     f"{r['peak_mb']:.0f} | {r['compared']} | {named} |")
    lines += ["", f"Reading one 8-rank sidecar's `/v1/status` with 256 arrivals per rank ({size / 1024:.0f} KiB): "
              f"{read_s * 1000:.1f} ms (wire.loads_status, off the event loop as every status answer)."]
    text = "\n".join(lines) + "\n"
    print(text)
    write_section(Path(args.results), text, SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
