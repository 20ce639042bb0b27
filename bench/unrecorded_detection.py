#!/usr/bin/env python3
"""Hangs the recorder cannot see: how fast the sidecar suspects a gloo `monitored_barrier` or
torch.distributed.pipelining stage waiting for a rank stuck in Python, and whether the analysis of its
capture names that rank (docs/sidecar.md, "Hangs the recorder cannot see").

What it runs: real gloo jobs on loopback (frscope.testing.rhythm_job, `--pattern monitored_barrier` with
rank 1 stopping after its step's all_reduces, or `--pattern pipeline` with stage 0 stopping in its
forward; 3 ranks in one pod, through the zero-code bootstrap) and an in-process sidecar with its default
timing (a poll every 2 s, --suspect-min 4 s, --suspect-after 15 s; --stall-after 600 s: only the
suspicion is measured). Measured from the moment the culprit stopped (it writes the time) to the
sidecar's suspicion; *named*: its suspicion capture analyzed as the operator does (stall threshold half
the quiet time) names the culprit, alone, first.

    .venv/bin/python bench/unrecorded_detection.py                 # 3 runs per pattern and step period
    .venv/bin/python bench/unrecorded_detection.py --runs 1 --results /tmp/u.md

Only the "## Hangs the recorder cannot see" section of the results file is written; the rest is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frscope.analysis import AnalysisOptions, analyze
from frscope.records import assemble, normalize_dump
from frscope.sidecar.app import Sidecar
from frscope.sidecar.config import SidecarConfig
from frscope.testing.rhythm_launch import start_rhythm_job

SECTION = "## Hangs the recorder cannot see"
PATTERNS = {"monitored_barrier": 1, "pipeline": 0}  # pattern -> the rank that stops


async def one(pattern: str, step_s: float) -> tuple[float, bool]:
    culprit = PATTERNS[pattern]
    args = ["--pattern", pattern, "--steps", "1000", "--step-s", str(step_s), "--jitter-s", str(step_s / 10),
            "--hang-step", str(max(6, int(12 / step_s))), "--culprit", str(culprit)]
    with start_rhythm_job(3, 3, args, lifetime_s=240) as job:
        job.wait_for_sockets()
        cfg = SidecarConfig(socket_dir=job.pods[0], evidence_dir=None, host="127.0.0.1", port=0, stall_after_s=600.0)
        sidecar = Sidecar(cfg, CollectorRegistry())
        await sidecar.start()
        try:
            deadline = time.monotonic() + 200
            while not sidecar.unrecorded.suspected:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{pattern} at {step_s} s: never suspected")
                await asyncio.sleep(0.05)
            suspected_ns = time.time_ns()
            stopped = job.hang_started_ns()
            if stopped is None:
                raise RuntimeError(f"{pattern} at {step_s} s: suspected before the culprit stopped")
            while sidecar.current_capture() is None:
                await asyncio.sleep(0.05)
            capture = sidecar.current_capture()
            assert capture is not None
            body = json.loads(gzip.decompress(capture.body_gz))
            dumps = [normalize_dump(p, p["source"], p["rank"]) for p in body["ranks"]]
            quiet = sidecar.unrecorded.quiet_s(capture.captured_at_ns)
            report = analyze(assemble(dumps, []), AnalysisOptions(stall_after_s=quiet / 2))
            named = bool(report.findings) and report.findings[0].culprit_ranks == (culprit,)
            return (suspected_ns - stopped) / 1e9, named
        finally:
            await sidecar.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", default="0.1,0.5,2", help="step periods (s)")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    args = parser.parse_args()
    started = time.monotonic()
    rows = []
    for pattern in PATTERNS:
        for step in [float(x) for x in args.steps.split(",")]:
            got = [asyncio.run(one(pattern, step)) for _ in range(args.runs)]
            times = sorted(t for t, _ in got)
            rows.append((pattern, step, times, sum(n for _, n in got)))
            print(pattern, step, [round(t, 1) for t in times], flush=True)
    lines = [SECTION, "", f"Command: `python bench/unrecorded_detection.py --runs {args.runs} --steps {args.steps}` "
             f"({(time.monotonic() - started) / 60:.1f} min wall, {platform.machine()}; the machine's cores shared "
             "with other work)", "",
             "| pattern | step period | runs | culprit stopped -> suspected: median / max (s) | capture names it |",
             "|---|---|---|---|---|"]
    for pattern, step, times, named in rows:
        lines.append(f"| {pattern} | {step:g} s | {len(times)} | {statistics.median(times):.1f} / {max(times):.1f} "
                     f"| {named} of {len(times)} |")
    lines += ["", "A suspicion needs quiet recorders past 3 x the job's usual step (at least `--suspect-min`, 4 s) "
              "and the same wait in two stack samples a round apart (2 s).", ""]
    text = args.results.read_text() if args.results.exists() else ""
    section = "\n".join(lines)
    if SECTION in text:
        head, _, rest = text.partition(SECTION)
        nxt = rest.find("\n## ")
        text = head + section + ("\n" + rest[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    args.results.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
