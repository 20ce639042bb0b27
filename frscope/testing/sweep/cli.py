"""`scripts/fault_sweep.py run | score | report` (see that script's docstring)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from frscope.testing.sweep.classes import CLASSES

DEFAULT_ROOT = Path.home() / ".cache" / "frscope-sweep"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fault_sweep.py", description="frscope's real-torch fault sweep")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run jobs and keep their captures")
    run_p.add_argument("--seed", type=int, required=True)
    run_p.add_argument("--jobs", type=int, required=True, help="how many jobs to draw (classes in turn)")
    run_p.add_argument("--first", type=int, default=0, help="skip the first N drawn jobs (a later batch)")
    run_p.add_argument("--classes", default="all", help=f"comma-separated, or all: {','.join(CLASSES)}")
    run_p.add_argument("--torch", default="2.13,2.15",
                       help="torch minors, in turn; a version without a venv is left out (default %(default)s)")
    run_p.add_argument("--parallel", type=int, default=3, help="jobs at once (default %(default)s)")
    run_p.add_argument("--max-world", type=int, default=8, help="largest world size drawn (default %(default)s)")
    run_p.add_argument("--out", type=Path, help="capture root (default ~/.cache/frscope-sweep/<seed>)")
    score_p = sub.add_parser("score", help="score frscope (and torchfrtrace) on saved captures")
    score_p.add_argument("dir", type=Path)
    score_p.add_argument("--no-torchfrtrace", action="store_true")
    score_p.add_argument("--classes", default="all")
    score_p.add_argument("--results", type=Path, help="default: <dir>/results.json")
    report_p = sub.add_parser("report", help="write docs/accuracy.md from a scored sweep")
    report_p.add_argument("dir", type=Path)
    report_p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[3] / "docs" / "accuracy.md")
    report_p.add_argument("--results-copy", type=Path, help="also copy the small results JSON here")
    report_p.add_argument("--repeat", type=Path, help="a scored second run of the same seed: compare verdicts")
    misses_p = sub.add_parser("misses", help="print every miss of a scored sweep, grouped by class (Markdown)")
    misses_p.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    command = "scripts/fault_sweep.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    if args.command == "run":
        from frscope.testing.sweep.runner import available_versions, run_batch

        classes = list(CLASSES) if args.classes == "all" else args.classes.split(",")
        versions = available_versions(args.torch.split(","))
        if not versions:
            print("fault_sweep: no torch venv available", file=sys.stderr)
            return 2
        out = args.out or DEFAULT_ROOT / str(args.seed)
        print(f"fault_sweep: {args.jobs} jobs, seed {args.seed}, torch {versions}, into {out}", file=sys.stderr)
        results = run_batch(args.seed, args.jobs, classes, versions, out, args.parallel, command, first=args.first,
                            max_world=args.max_world)
        failed = [r for r in results if "error" in r]
        print(f"fault_sweep: {len(results)} jobs run, {len(failed)} failed to run", file=sys.stderr)
        return 1 if failed else 0
    if args.command == "score":
        from frscope.testing.sweep.score import score_dir

        classes = None if args.classes == "all" else set(args.classes.split(","))
        summary = score_dir(args.dir, torchfrtrace=not args.no_torchfrtrace, classes=classes,
                            results_path=args.results)
        print(summary)
        return 0
    if args.command == "misses":
        import json

        from frscope.testing.sweep.report import render_misses

        print(render_misses(json.loads((args.dir / "results.json").read_text()), args.dir))
        return 0
    from frscope.testing.sweep.report import write_report

    write_report(args.dir, args.out, args.results_copy, args.repeat)
    return 0
