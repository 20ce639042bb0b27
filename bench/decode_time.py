#!/usr/bin/env python3
"""A slow pickle beside good ranks, through the real `frscope analyze` (issue 26).

The slow file: a dict of `--keys` int keys that all hash alike (`frscope.testing.slow_pickles`), ~2 MiB
at 150,000 keys, which the unpickler decodes in time quadratic in the keys. Beside it `--good` regular
ranks. Measured: the wall-clock and CPU time (the CLI and its decode workers) of `frscope analyze DIR
--format json` (a real subprocess, default limits), its exit code, the ranks it analyzed and the problem
it reports for the slow file; and, for comparison, the same command on the good ranks alone.

    .venv/bin/python bench/decode_time.py                 # prints a table, appends it to RESULTS.md
    .venv/bin/python bench/decode_time.py --no-results    # just print
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from frscope.testing.slow_pickles import colliding_int_keys  # noqa: E402
from tests.unit import builders as b  # noqa: E402


def analyze(directory: Path) -> tuple[float, float, int, dict[str, Any]]:
    out = directory.parent / f"{directory.name}.json"
    started, cpu = time.monotonic(), _children_cpu()
    proc = subprocess.run([sys.executable, "-m", "frscope", "analyze", str(directory), "--format", "json",
                           "-o", str(out)], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=3600)
    elapsed, cpu = time.monotonic() - started, _children_cpu() - cpu
    report = json.loads(out.read_text()) if out.exists() else {}
    return elapsed, cpu, proc.returncode, report


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=150_000)
    parser.add_argument("--good", type=int, default=3)
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        good, mixed = Path(tmp, "good"), Path(tmp, "mixed")
        for directory in (good, mixed):
            directory.mkdir()
            for rank in range(args.good):
                (directory / f"nccl_trace_rank_{rank}").write_bytes(
                    pickle.dumps(b.dump([b.entry(s) for s in range(1, 2001)], world=args.good + 1), protocol=2))
        slow = mixed / f"nccl_trace_rank_{args.good}"
        slow.write_bytes(colliding_int_keys(args.keys))
        size = slow.stat().st_size
        rows = []
        for name, directory in (("good ranks alone", good), (f"good + slow pickle ({size / 2**20:.1f} MiB)", mixed)):
            elapsed, cpu, code, report = analyze(directory)
            problems = [p for p in report.get("problems", []) if isinstance(p, dict) and p.get("kind") == "error"]
            said = "; ".join(f"rank {p.get('rank')}: {p.get('message')}" for p in problems) or "-"
            rows.append(f"| {name} | {elapsed:.1f} s | {cpu:.1f} s | {code} | {report.get('ranks_loaded')} | {said} |")
    table = "\n".join([
        f"`.venv/bin/python bench/decode_time.py --keys {args.keys} --good {args.good}` "
        f"({os.cpu_count()} cores, shared; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        "| set | wall | CPU (all processes) | exit | ranks analyzed | problems |",
        "|---|---|---|---|---|---|",
        *rows,
    ])
    print(table)
    if not args.no_results:
        with (REPO / "bench" / "RESULTS.md").open("a") as handle:
            handle.write("\n## Issue 26: a slow pickle beside good ranks (`frscope analyze`)\n\n" + table + "\n")


if __name__ == "__main__":
    main()
