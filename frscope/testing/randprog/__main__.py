"""`python -m frscope.testing.randprog sweep --seed S --programs N [--jobs J]` scores frscope on N random
programs; `replay SEED [--keep DIR]` shows one program, its truth and frscope's verdict in every form."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from frscope.testing.randprog.case import FORMS, describe, make_case
from frscope.testing.randprog.score import judge, run_form, summarize, sweep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m frscope.testing.randprog", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sw = sub.add_parser("sweep", help="score frscope on random programs")
    sw.add_argument("--seed", type=int, default=1)
    sw.add_argument("--programs", type=int, default=1000)
    sw.add_argument("--jobs", type=int, default=2)
    sw.add_argument("--rows", help="write every verdict here (JSON lines)")
    sw.add_argument("--misses", type=int, default=30, help="miss patterns to list")
    rp = sub.add_parser("replay", help="one program in detail")
    rp.add_argument("seed", type=int)
    rp.add_argument("--keep", help="write the three forms' files under this folder")
    args = ap.parse_args(argv)
    if args.cmd == "sweep":
        started = time.perf_counter()
        rows = sweep(args.seed, args.programs, args.jobs)
        took = time.perf_counter() - started
        if args.rows:
            Path(args.rows).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"randprog sweep --seed {args.seed} --programs {args.programs}: {took:.0f} s "
              f"({60 * args.programs / max(took, 1e-9):.0f} programs a minute, {args.jobs} jobs)")
        print(summarize(rows, args.misses))
        return 0
    case = make_case(args.seed)
    print(describe(case))
    with tempfile.TemporaryDirectory(prefix="randprog-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for form in FORMS:
            report = run_form(case, form, root / form)
            right, got = judge(report, case)
            why = case.undecidable(form)
            print(f"{form:8s} {'right' if right else 'MISS '} got {got}" + (f"  [undecidable: {why}]" if why else ""))
            if report is not None and report.findings:
                print("         " + report.findings[0].summary[:240])
    return 0


if __name__ == "__main__":
    sys.exit(main())
