"""`python -m frscope.testing.synthetic OUT_DIR ...`: write a scenario's dumps, print the ground truth."""


from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from frscope.testing.synthetic.hung_step import make_plan
from frscope.testing.synthetic.topology import DEFAULT_PREFIX, FORMATS, SCENARIOS, SHAPES
from frscope.testing.synthetic.writing import write_plan


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m frscope.testing.synthetic",
        description="Write synthetic per-rank Flight Recorder dumps with a known answer (printed as JSON).",
    )
    parser.add_argument("out_dir")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--entries", type=int, default=2000, help="ring buffer size per rank (default 2000)")
    parser.add_argument("--shape", choices=SHAPES, default="nccl")
    parser.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    parser.add_argument("--format", dest="fmt", choices=FORMATS, default="pickle")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX)
    parser.add_argument("--culprit", type=int, default=None, help="rank to break (default: random, not 0)")
    parser.add_argument("--position", default=None, help="step position key of the fault (e.g. dp_rs)")
    parser.add_argument("--tp", type=int, default=None)
    parser.add_argument("--pp", type=int, default=None)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--straggle-ms", type=float, default=250.0)
    parser.add_argument("--clock-skew-ms", type=float, default=0.0)
    parser.add_argument("--no-wrap", action="store_true", help="keep the whole run in the ring buffer")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--truth", default=None, help="also write the ground truth JSON to this file")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    try:
        plan = make_plan(
            args.ranks, entries=args.entries, shape=args.shape, scenario=args.scenario, seed=args.seed,
            culprit=args.culprit, position=args.position, tp=args.tp, pp=args.pp, layers=args.layers,
            straggle_ms=args.straggle_ms, clock_skew_ms=args.clock_skew_ms, wrap=not args.no_wrap,
        )
    except ValueError as exc:
        parser.error(str(exc))
    size = write_plan(plan, args.out_dir, fmt=args.fmt, prefix=args.prefix, jobs=args.jobs)
    text = json.dumps(plan.truth.to_dict(), indent=2)
    if args.truth:
        Path(args.truth).write_text(text + "\n")
    print(text)
    print(
        f"wrote {len(plan.ranks_to_write())} files ({size / 2**20:.1f} MiB) to {args.out_dir} "
        f"in {time.perf_counter() - began:.1f} s",
        file=sys.stderr,
    )
    return 0

