#!/usr/bin/env python3
"""JSON dumps through the C scanner's JSON front-end (`records.scan.scan_json_dump`) against the reference
(`json.loads` + the normalizer), issue 36.

1. One rank's decode, in this process: a `--entries` JSON dump (torch's `_dump_fr_trace_json` shape, from
   frscope.testing.synthetic) and the same recorder wrapped as a frscope snapshot piece, read the reference way
   (`loader.decode_bytes` then `normalize_dump(columnar=True)`) and by the scanner (`scan_json_dump` then
   `normalize_dump(prebuilt=...)`): best and median CPU time of `--repeat` reads each.
2. The operator's decoding of one pod's `/v1/snapshot` body (`--pod-ranks` ranks of `--pod-entries` entries,
   the live window's shape), in this process, cut to the window (`max_entries` = `--pod-entries`): from its
   file, piece by piece (`push_decode.decode_file`: the gather and the live window) and from bytes
   (`pod_evidence.from_bytes`), with the scanner and with `FRSCOPE_NO_SCANNER=1` (the reference).
3. `frscope analyze DIR --format json` (a real subprocess, default limits) on `--ranks` such JSON dumps, with
   `--before` (a checkout: main) and with this tree, one after the other on the same files: wall-clock, CPU (the
   CLI and its decode workers), exit code, and whether the two reports' findings agree.

    .venv/bin/python bench/json_scan.py                       # prints a table, appends it to RESULTS.md
    .venv/bin/python bench/json_scan.py --ranks 0 --no-results  # part 1 only, just print
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from frscope import wire  # noqa: E402
from frscope.operator.evidence.pod_evidence import from_bytes  # noqa: E402
from frscope.operator.evidence.push_decode import decode_file  # noqa: E402
from frscope.records import scan  # noqa: E402
from frscope.records.loader import decode_bytes  # noqa: E402
from frscope.records.model import LazyFrames  # noqa: E402
from frscope.records.normalize import normalize_dump, parse_profiling_name  # noqa: E402
from frscope.testing.synthetic import generate  # noqa: E402


def _reads(data: bytes, repeat: int) -> tuple[list[float], list[float]]:
    lazy = LazyFrames(lambda: None)

    def reference() -> None:
        normalize_dump(decode_bytes(data, "x"), "x", 0, lazy, columnar=True)

    def scanned() -> None:
        got = scan.scan_json_dump(data, lazy, parse_profiling_name)
        assert got is not None, "the scanner declined the benchmark's dump"
        meta, table, backend = got
        normalize_dump(meta, "x", 0, lazy, columnar=True, prebuilt=(table, backend))

    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for out, read in zip(times, (reference, scanned), strict=True):
            started = time.process_time()  # CPU: the machine's other processes change the wall-clock
            read()
            out.append((time.process_time() - started) * 1e3)
    return times


def _pod_body(directory: Path, ranks: int, entries: int) -> bytes:
    generate(directory, ranks, entries=entries, shape="nccl", fmt="json", scenario="not_joined", seed=2)
    pieces = [wire.snapshot_piece_bytes(rank, 1, "bench", "Thread 0x1 (most recent call first):\n",
                                        (directory / f"nccl_trace_rank_{rank}.json").read_bytes())
              for rank in range(ranks)]
    head = wire.snapshot_head(pod="bench-0", namespace="bench", node="n", captured_at_ns=1, reason="poll")
    return wire.snapshot_envelope_bytes(head, pieces, [])


def _pod_decodes(data: bytes, path: Path, entries: int, repeat: int) -> list[str]:
    path.write_bytes(data)
    def from_file() -> Any:
        return decode_file(str(path), "bench", origin="sidecar", max_entries=entries)

    def from_memory() -> Any:
        return from_bytes(data, "bench", origin="sidecar", max_entries=entries)

    ways: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("from its file (`decode_file`)", from_file), ("from bytes (`from_bytes`)", from_memory))
    rows = []
    for name, decode in ways:
        times: dict[str, list[float]] = {"reference": [], "scanner": []}
        for _ in range(repeat):
            for how in times:
                os.environ[scan.ENV_OFF] = "1" if how == "reference" else "0"
                started = time.process_time()
                decode()
                times[how].append((time.process_time() - started) * 1e3)
        os.environ.pop(scan.ENV_OFF, None)
        ref, fast = statistics.median(times["reference"]), statistics.median(times["scanner"])
        rows.append(f"| {name} | {min(times['reference']):.1f} / {ref:.1f} ms | "
                    f"{min(times['scanner']):.1f} / {fast:.1f} ms | {ref / fast:.1f}x |")
    return rows


def analyze(tree: Path, directory: Path, out: Path) -> tuple[float, float, int, dict[str, Any]]:
    started, cpu = time.monotonic(), _children_cpu()
    proc = subprocess.run([sys.executable, "-m", "frscope", "analyze", str(directory), "--format", "json",
                           "--no-progress", "-o", str(out)], capture_output=True, text=True, cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)}, timeout=3600)
    elapsed, cpu = time.monotonic() - started, _children_cpu() - cpu
    report = json.loads(out.read_text()) if out.exists() else {}
    return elapsed, cpu, proc.returncode, report


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _verdict(report: dict[str, Any]) -> Any:
    return [(f.get("kind"), f.get("ranks"), f.get("group")) for f in report.get("findings", []) if isinstance(f, dict)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--ranks", type=int, default=1024, help="0: no `frscope analyze` runs")
    parser.add_argument("--pod-ranks", type=int, default=8)
    parser.add_argument("--pod-entries", type=int, default=256)
    parser.add_argument("--before", type=Path, default=Path("/work/main"), help="the checkout to compare with")
    parser.add_argument("--no-results", action="store_true")
    args = parser.parse_args()
    if not scan.available():
        sys.exit("the C scanner is not built (python setup.py build_ext --inplace)")
    rows, runs, pod_rows = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp, "one")
        generate(one, 8, entries=args.entries, shape="nccl", fmt="json", scenario="not_joined", seed=1)
        plain = (one / "nccl_trace_rank_0.json").read_bytes()
        piece = json.dumps({"frscope_snapshot": 1, "rank": 0, "captured_at_ns": 1, "source": "bench",
                            "stacks": "Thread 0x1 (most recent call first):\n  File \"t.py\", line 1 in f\n",
                            "trace": json.loads(plain)}).encode()
        for name, data in (("torch's JSON dump", plain), ("snapshot piece", piece)):
            reference, scanned = _reads(data, args.repeat)
            ref_med, scan_med = statistics.median(reference), statistics.median(scanned)
            rows.append(f"| {name} ({len(data) / 2**20:.2f} MiB) | {min(reference):.1f} / {ref_med:.1f} ms | "
                        f"{min(scanned):.1f} / {scan_med:.1f} ms | {ref_med / scan_med:.0f}x |")
        body = _pod_body(Path(tmp, "pod"), args.pod_ranks, args.pod_entries)
        pod_rows = _pod_decodes(body, Path(tmp, "body.json"), args.pod_entries, args.repeat)
        if args.ranks:
            many = Path(tmp, "many")
            generate(many, args.ranks, entries=args.entries, shape="nccl", fmt="json", scenario="not_joined",
                     seed=1, jobs=os.cpu_count() or 1)
            mib = sum(p.stat().st_size for p in many.iterdir()) / 2**20
            reports: list[dict[str, Any]] = []
            for label, tree in ((f"before ({args.before})", args.before), ("after (this tree)", REPO)):
                elapsed, cpu, code, report = analyze(tree, many, Path(tmp, f"report-{len(reports)}.json"))
                reports.append(report)
                loaded = len(report.get("ranks_loaded") or [])
                runs.append(f"| {label} | {elapsed:.1f} s | {cpu:.1f} s | {code} | {loaded:,} |")
            same = _verdict(reports[0]) == _verdict(reports[1])
            runs.append(f"\n{args.ranks:,} ranks x {args.entries:,} entries, {mib:,.0f} MiB of JSON; "
                        f"findings {'identical' if same else 'DIFFER'} ({len(_verdict(reports[1]))} findings).")
    table = "\n".join([
        f"`.venv/bin/python bench/json_scan.py --entries {args.entries} --ranks {args.ranks}` "
        f"({os.cpu_count()} cores, shared: load average {os.getloadavg()[0]:.0f}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        "| one rank's JSON | reference: json.loads + normalize (CPU, best / median) | C scanner + normalize | "
        "speed-up (medians) |",
        "|---|---|---|---|",
        *rows,
        "",
        f"| the operator, one pod's body ({args.pod_ranks} ranks x {args.pod_entries} entries, "
        f"{len(body) / 2**20:.2f} MiB) | reference (CPU, best / median) | C scanner | speed-up (medians) |",
        "|---|---|---|---|",
        *pod_rows,
        *(["", "| `frscope analyze DIR --format json` | wall | CPU (all processes) | exit | ranks analyzed |",
           "|---|---|---|---|---|", *runs] if runs else []),
    ])
    print(table)
    if not args.no_results:
        with (REPO / "bench" / "RESULTS.md").open("a") as handle:
            handle.write("\n" + table + "\n")


if __name__ == "__main__":
    main()
