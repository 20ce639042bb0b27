#!/usr/bin/env python3
"""`frscope analyze --perf` on the straggler jobs of a saved fault sweep (scripts/fault_sweep.py run):
does the first line name the planted straggler?

    .venv/bin/python scripts/perf_on_sweep.py ~/.cache/frscope-sweep/2313 [--forms json,pickle,snapshot]

Each job directory holds the planted truth (`truth.json`: `culprit_ranks`) and the same capture in three
forms (`json/`, `pickle/`, `snapshot/`). A job counts as right when the rank `--perf` names first (the
costliest) is a planted culprit. Prints one Markdown table per class and the jobs it missed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frscope.analysis.perf import analyze_perf
from frscope.records import load_dumps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--forms", default="json,pickle,snapshot")
    args = parser.parse_args()
    forms = [f for f in args.forms.split(",") if f]
    per_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    misses: list[str] = []
    for job in sorted(p for p in args.sweep.iterdir() if p.is_dir() and "straggler" in p.name):
        truth_path = job / "truth.json"
        if not truth_path.exists():
            continue
        truth = json.loads(truth_path.read_text())
        culprits = set(truth["culprit_ranks"])
        for form in forms:
            source = job / form
            if not source.is_dir() or not any(source.iterdir()):
                continue
            perf = analyze_perf(load_dumps([source], jobs=1))
            named = perf.costs[0].rank if perf.costs else None
            right = named in culprits and perf.headline.startswith(f"Rank {named} costs the job most")
            tally = per_class[f"{truth['class']} ({form})"]
            tally[0] += right
            tally[1] += 1
            if not right:
                misses.append(f"- {job.name} ({form}): planted {sorted(culprits)}; --perf: {perf.headline}")
    print("| class (form) | named the planted straggler first |\n|---|---:|")
    total = [0, 0]
    for name, (right, count) in sorted(per_class.items()):
        print(f"| {name} | {right} of {count} |")
        total[0] += right
        total[1] += count
    print(f"| all | {total[0]} of {total[1]} |")
    if misses:
        print("\nMissed:\n" + "\n".join(misses))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
