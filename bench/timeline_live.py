#!/usr/bin/env python3
"""The timeline with each rank's own times, the list view and the live window at scale (issue 25).

    .venv/bin/python bench/timeline_live.py [--ranks 1024] [--entries 2000] [--live-entries 256] [--no-browser]

A synthetic NCCL-shaped job (nobody here can run 1,024 ranks) with realistic noise: every rank's creation
time of a collective jitters by up to 2 ms and one rank arrives 30 ms late at every 10th; durations are
the wait for the last rank plus a transfer of 0.3-0.5 ms (what NCCL with timing records). Measured:

1. `build_timeline` (what `frscope analyze --html` and a diagnosis build once): time, JSON size raw and
   gzipped, and the share taken by each rank's own times (`rank_times`);
2. `analyze_perf` (`--perf`) and `trace_from_timeline` (the web UI's trace.json): time and size;
3. the live window's work per refresh (`LiveWindows.refresh` after the gather: timeline + perf of the
   newest `--live-entries` entries of every rank);
4. in headless Chromium (Debian's chromium through Playwright, as tests/browser): load, first frame,
   the list view (scroll to the end, sort by wait), jump to a rank and to a seq, the state filter, and
   the longest main-thread task seen (PerformanceObserver 'longtask').

Prints one Markdown block for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from frscope.analysis.perf import analyze_perf  # noqa: E402
from frscope.records import DumpSet, Entry, GroupInfo, RankDump  # noqa: E402
from frscope.report.html import render_html  # noqa: E402
from frscope.report.perf import perf_to_dict  # noqa: E402
from frscope.report.timeline import build_timeline  # noqa: E402
from frscope.report.trace import trace_from_timeline  # noqa: E402

T0 = 1_700_000_000_000_000_000
STEP_NS = 5_000_000
LATE_RANK = 517


def noisy_job(world: int, entries: int, seed: int = 0) -> DumpSet:
    """Every rank all_reduces (broadcast every 7th) in one group; jittered arrivals, NCCL durations."""
    rng = random.Random(seed)
    jitter = [[rng.randrange(0, 2_000_000) for _ in range(world)] for _ in range(entries)]
    dumps: dict[int, RankDump] = {}
    sizes_a: list[list[int]] = [[1024, 1024]]
    sizes_b: list[list[int]] = [[16]]
    dt = ["Float"]
    lasts = []
    for seq in range(1, entries + 1):
        row = jitter[seq - 1]
        if seq % 10 == 0:
            row[LATE_RANK % world] += 30_000_000
        lasts.append(max(row))
    for rank in range(world):
        out: list[Entry] = []
        for seq in range(1, entries + 1):
            op = "broadcast" if seq % 7 == 0 else "all_reduce"
            sizes = sizes_b if op == "broadcast" else sizes_a
            base = T0 + seq * STEP_NS
            created = base + jitter[seq - 1][rank]
            transfer = 300_000 + (seq * 7919 + rank * 104_729) % 200_000
            end = base + lasts[seq - 1] + transfer
            out.append(Entry(seq - 1, "0", "default_pg", seq, 0, False, op, "nccl:" + op, None, sizes, dt, sizes, dt,
                             "completed", None, created, created + 1000, end, (end - created - 1000) / 1e6, 600_000,
                             "1", "python", None))
        dumps[rank] = RankDump(rank, f"synthetic-{rank}", "2.10", "nccl", out,
                               captured_at_ns=T0 + (entries + 10) * STEP_NS)
    return DumpSet(dumps, {"0": GroupInfo("0", "default_pg", tuple(range(world)), "world")}, world)


def window(dumpset: DumpSet, last: int) -> DumpSet:
    dumps = {r: RankDump(r, d.source, d.version, d.backend, list(d.entries)[-last:], captured_at_ns=d.captured_at_ns)
             for r, d in dumpset.dumps.items()}
    return DumpSet(dumps, dumpset.groups, dumpset.world_size)


def timed(fn: Any, *args: Any) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def browser(html_path: Path, ranks: int, entries: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("FRSCOPE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    out: dict[str, Any] = {}
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        context = b.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
        context.add_init_script("""window.__long = [];
            new PerformanceObserver(l => l.getEntries().forEach(e => window.__long.push(e.duration)))
              .observe({type: 'longtask', buffered: true});""")
        page = context.new_page()
        started = time.monotonic()
        page.goto(html_path.as_uri())
        page.wait_for_selector("body[data-ready=true]", state="attached", timeout=120_000)
        out["load_s"] = time.monotonic() - started
        s = page.evaluate("() => window.frscope.state()")
        out["first_frame_ms"] = s["renderMs"]
        assert s["rows"] == ranks, s

        def step(name: str, js: str) -> None:
            t = time.monotonic()
            page.evaluate(js)
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            out[name] = (time.monotonic() - t) * 1000

        page.evaluate("() => { window.__long = []; }")
        step("list_scroll_end_ms",
             "() => { const v = document.getElementById('fr-list-viewport'); v.scrollTop = v.scrollHeight; }")
        step("list_sort_wait_ms", "() => window.frscope.setListSort('wait')")
        step("jump_rank_ms", f"() => window.frscope.jump('rank {LATE_RANK % ranks}')")
        step("jump_seq_ms", f"() => window.frscope.jump('#{entries - 10}')")
        step("state_filter_ms", "() => window.frscope.setStates(['completed'])")
        step("rank_list_ms", "() => window.frscope.setRanks('0-99,517,900-1023')")
        out["dom_rows"] = page.evaluate("() => window.frscope.list().domRows")
        out["longest_task_after_load_ms"] = max(page.evaluate("() => window.__long") or [0])
        out["frame_after_filters_ms"] = page.evaluate("() => window.frscope.state().renderMs")
        context.close()
        b.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--live-entries", type=int, default=256)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    load0 = os.getloadavg()[0]
    dumpset = noisy_job(args.ranks, args.entries)
    timeline, tl_s, tl_cpu = timed(build_timeline, dumpset, None)
    raw = json.dumps(timeline, separators=(",", ":"))
    times = json.dumps([g.get("rank_times") for g in timeline["groups"]], separators=(",", ":"))
    perf, perf_s, perf_cpu = timed(analyze_perf, dumpset)
    trace, trace_s, _ = timed(trace_from_timeline, timeline)
    trace_raw = json.dumps(trace, separators=(",", ":"))
    live = window(dumpset, args.live_entries)
    _, live_tl_s, live_tl_cpu = timed(build_timeline, live, None)
    _, live_perf_s, live_perf_cpu = timed(analyze_perf, live)
    rows = [
        ("build_timeline, whole recorders", f"{tl_s:.1f} s wall, {tl_cpu:.1f} s CPU"),
        ("timeline JSON", f"{len(raw) / 1e6:.2f} MB raw, {len(gzip.compress(raw.encode())) / 1e6:.2f} MB gzip; "
                          f"rank_times {len(times) / 1e6:.2f} MB raw "
                          f"(window {timeline['groups'][0]['rank_times']['first_col']}-{args.entries - 1})"),
        ("analyze_perf (--perf)", f"{perf_s:.1f} s wall, {perf_cpu:.1f} s CPU; headline: {perf.headline}"),
        ("trace_from_timeline (trace.json)", f"{trace_s:.2f} s, {len(trace_raw) / 1e6:.1f} MB raw, "
                                             f"{len(gzip.compress(trace_raw.encode())) / 1e6:.2f} MB gzip"),
        (f"live window work per refresh ({args.live_entries} entries x {args.ranks} ranks)",
         f"timeline {live_tl_s:.1f} s wall ({live_tl_cpu:.1f} s CPU) + perf {live_perf_s:.1f} s "
         f"({live_perf_cpu:.1f} s CPU)"),
    ]
    if not args.no_browser:
        with tempfile.TemporaryDirectory() as tmp:
            page = Path(tmp) / "big.html"
            page.write_text(render_html(None, timeline, perf=perf_to_dict(perf)), encoding="utf-8")
            size = page.stat().st_size
            b = browser(page, args.ranks, args.entries)
        rows += [
            ("HTML file", f"{size / 1e6:.2f} MB"),
            ("Chromium: load to ready", f"{b['load_s']:.1f} s; first frame {b['first_frame_ms']:.0f} ms"),
            ("Chromium: list scroll to the end / sort by wait",
             f"{b['list_scroll_end_ms']:.0f} ms / {b['list_sort_wait_ms']:.0f} ms ({b['dom_rows']} rows in the DOM)"),
            ("Chromium: jump to a rank / to a seq", f"{b['jump_rank_ms']:.0f} ms / {b['jump_seq_ms']:.0f} ms"),
            ("Chromium: state filter / rank list", f"{b['state_filter_ms']:.0f} ms / {b['rank_list_ms']:.0f} ms; "
                                                   f"frame after them {b['frame_after_filters_ms']:.0f} ms"),
            ("Chromium: longest main-thread task after load", f"{b['longest_task_after_load_ms']:.0f} ms"),
        ]
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=REPO).stdout.strip()
    print("## Timeline with each rank's own times, list view, live window (issue 25)\n")
    print(f"- {args.ranks} ranks x {args.entries} entries, synthetic NCCL shape with jitter (bench/timeline_live.py); "
          f"frscope {git}, Python {platform.python_version()}, `nproc` {os.cpu_count()}, load {load0:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end")
    print(f"- Command: `.venv/bin/python bench/timeline_live.py --ranks {args.ranks} --entries {args.entries} "
          f"--live-entries {args.live_entries}{' --no-browser' if args.no_browser else ''}`\n")
    print("| what | result |\n|---|---|")
    for what, result in rows:
        print(f"| {what} | {result} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
