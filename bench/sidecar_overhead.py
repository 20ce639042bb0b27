#!/usr/bin/env python3
"""Sidecar overhead: N local ranks with full 2,000-entry recorders, polled every 10 s.

What it runs: N gloo ranks of bench/sidecar_train.py on loopback (no frscope in the script: the
worker-server socket comes from the sitecustomize bootstrap on PYTHONPATH), each filling its Flight
Recorder with 2,100 collectives and then training (a little compute + one all_reduce per step).
Windows of --window seconds alternate: sidecar off, sidecar on, off, on, ... In an "on" window a
fresh `frscope sidecar` process polls every rank every --poll-interval seconds while a client asks
for /metrics --metrics-rate times a second.

What it measures, in the "on" windows (from --skip seconds after the sidecar started, so that its
interpreter start is not counted): the sidecar's CPU (user+sys from /proc/<pid>/stat, divided by the
wall time), its RSS (VmRSS sampled every 0.5 s, and VmHWM), /metrics latency (p50/p99, client side,
loopback), the sidecar's own poll round durations (frscope_poll_duration_seconds); and in every
window the training step time of all ranks (median and mean over every rank's steps, the first
--skip seconds of each window left out). The difference between "on" and "off" step times is the
sidecar's cost to training; the difference between windows of the same kind is the noise floor.

    .venv/bin/python bench/sidecar_overhead.py                   # 8 ranks, 10 s polls, writes bench/RESULTS.md
    .venv/bin/python bench/sidecar_overhead.py --ranks 2 --window 20 --results /tmp/r.md   # quick look

Only the "## Sidecar overhead" section of the results file is written; the rest is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Sidecar overhead"
KEEP_MARKER = "<!-- notes below are kept across runs -->"
CLK_TCK = os.sysconf("SC_CLK_TCK")
HOW_TO_READ = (
    "How to read this: `fr_trace_json` takes no filter and makes a rank serialize its whole recorder to "
    "JSON inside torch (about 50 ms of CPU per 2,000-entry recorder on this machine); with synchronous "
    "collectives the slowest rank sets the step. The sidecar therefore asks each rank's cheap progress "
    "probe (`frscope_progress`, registered by the bootstrap: the recorder's pg_status without entries, "
    "microseconds) every poll and the full recorder only every --full-poll-every polls (default 6), when "
    "a rank (re)appears, on ?refresh=1, and at once when progress stops with a collective in flight "
    "(docs/sidecar.md). Here 8 CPU-bound ranks, the sidecar and other engineers' jobs share 2 cores, so "
    "the noise floor (two windows of the same kind) is of the order of the effect; compare the "
    "not-polling row for the /metrics latency floor."
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def start_ranks(n: int, work: Path, sockets: Path, logs: Path, script: str = "sidecar_train.py",
                extra: tuple[str, ...] = ()) -> list[subprocess.Popen[bytes]]:
    from frscope.sidecar.bootstrap import BOOTSTRAP_DIR

    port = free_port()
    procs = []
    for rank in range(n):
        env = {
            **os.environ,
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "PYTHONPATH": str(BOOTSTRAP_DIR), "FRSCOPE_SOCKET_DIR": str(sockets),
            "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1",
        }
        env.pop("FRSCOPE_WORKER_SERVER_PID", None)
        out = open(logs / f"rank-{rank}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, str(REPO / "bench" / script), str(logs), *extra],
            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=work, start_new_session=True,
        ))
    return procs


class Sidecar:
    def __init__(self, sockets: Path, work: Path, poll_interval: float) -> None:
        self.port_file = work / "sidecar.port"
        self.port_file.unlink(missing_ok=True)
        self.log = open(work / "sidecar.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(sockets), "--evidence-dir", "none",
             "--host", "127.0.0.1", "--port", "0", "--port-file", str(self.port_file),
             "--poll-interval", str(poll_interval)],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=work,
        )
        deadline = time.monotonic() + 60
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"sidecar did not start: see {work / 'sidecar.log'}")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as resp:
            return bytes(resp.read())

    def stop(self) -> int | None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()
        return self.proc.returncode


def poll_durations(metrics_text: str) -> tuple[float, float]:
    count = total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("frscope_poll_duration_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("frscope_poll_duration_seconds_sum"):
            total = float(line.split()[-1])
    return count, total


def run_on_window(sockets: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """First half: polling plus a Prometheus-like scrape every --scrape-interval s (the CPU figure).
    Second half: polling plus /metrics --metrics-rate times a second (the latency figures)."""
    started = time.time()
    sidecar = Sidecar(sockets, work, args.poll_interval)
    pid = sidecar.proc.pid
    time.sleep(args.skip)
    t0, c0 = time.monotonic(), cpu_seconds(pid)
    count0, sum0 = poll_durations(sidecar.get("/metrics").decode())
    rss: list[int] = []
    half = started + args.skip + (args.window - args.skip) / 2
    next_scrape = time.time() + args.scrape_interval
    while time.time() < half:
        rss.append(status_kib(pid, "VmRSS"))
        if time.time() >= next_scrape:
            sidecar.get("/metrics")
            next_scrape += args.scrape_interval
        time.sleep(0.5)
    cpu = cpu_seconds(pid) - c0
    wall = time.monotonic() - t0
    count1, sum1 = poll_durations(sidecar.get("/metrics").decode())

    latencies: list[float] = []
    stop = threading.Event()

    def scrape() -> None:
        period = 1.0 / args.metrics_rate
        while not stop.is_set():
            a = time.perf_counter()
            sidecar.get("/metrics")
            latencies.append(time.perf_counter() - a)
            stop.wait(max(0.0, period - (time.perf_counter() - a)))

    t1, c1 = time.monotonic(), cpu_seconds(pid)
    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    end = started + args.window
    while time.time() < end:
        rss.append(status_kib(pid, "VmRSS"))
        time.sleep(0.5)
    stop.set()
    scraper.join(10)
    cpu_busy = (cpu_seconds(pid) - c1) / (time.monotonic() - t1)
    count2, sum2 = poll_durations(sidecar.get("/metrics").decode())
    status = json.loads(sidecar.get("/v1/status"))
    hwm = status_kib(pid, "VmHWM")
    code = sidecar.stop()
    return {
        "start": started, "end": time.time(), "cpu_s": cpu, "wall_s": wall, "cores": cpu / wall,
        "cores_with_metrics_load": cpu_busy,
        "rss_max_mib": max(rss) / 1024, "rss_hwm_mib": hwm / 1024, "metrics_n": len(latencies),
        "metrics_p50_ms": percentile(latencies, 0.5) * 1000, "metrics_p99_ms": percentile(latencies, 0.99) * 1000,
        "metrics_max_ms": max(latencies) * 1000 if latencies else float("nan"),
        "polls": count2 - count0, "poll_round_mean_s": (sum2 - sum0) / max(1.0, count2 - count0),
        "polls_cpu_half": count1 - count0,
        "ranks_up": sum(1 for r in status["ranks"].values() if r["up"]), "exit_code": code,
    }


def idle_latency(sockets: Path, work: Path, args: argparse.Namespace) -> dict[str, float]:
    """/metrics latency of a sidecar that polled once and then idles: the machine's own noise floor."""
    sidecar = Sidecar(sockets, work, 3600.0)
    time.sleep(args.skip)
    latencies: list[float] = []
    end = time.time() + args.idle_window
    while time.time() < end:
        a = time.perf_counter()
        sidecar.get("/metrics")
        latencies.append(time.perf_counter() - a)
        time.sleep(max(0.0, 1.0 / args.metrics_rate - (time.perf_counter() - a)))
    sidecar.stop()
    return {"n": len(latencies), "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000}


def steps_in(logs: Path, n: int, start: float, end: float) -> list[float]:
    out: list[float] = []
    for rank in range(n):
        for line in (logs / f"steps-{rank}.txt").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                t, d = float(parts[0]), float(parts[1])
                if start <= t <= end:
                    out.append(d)
    return out


def _subsections(body: str) -> list[tuple[str, str]]:
    """A section's `### ` subsections: (heading line, whole text from the heading on)."""
    parts = body.split("\n### ")
    return [("### " + p.split("\n", 1)[0], "### " + p.rstrip("\n") + "\n") for p in parts[1:]]


def write_section(path: Path, text: str, section: str = SECTION) -> None:
    """Replace (or add) only this section; other sections and run_bench.py's marker are kept, and so
    are the section's `### ` subsections that `text` does not have (another script writes them, see
    write_subsection)."""
    previous = path.read_text() if path.exists() else ""
    if section in previous:
        head, rest = previous.split(section, 1)
        nxt = rest.find("\n## ")
        tail = rest[nxt + 1:] if nxt >= 0 else ""
        body = rest[:nxt] if nxt >= 0 else rest
        mine = {h for h, _ in _subsections(text)}
        kept = "".join("\n" + t for h, t in _subsections(body) if h not in mine)
        new = head + text.rstrip("\n") + "\n" + kept + ("\n" + tail if tail else "")
    else:
        if KEEP_MARKER not in previous:
            # run_bench.py rewrites everything above its marker: this section lives below it.
            previous = previous.rstrip("\n") + ("\n\n" if previous else "") + KEEP_MARKER + "\n"
        new = previous.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    path.write_text(new)


def write_subsection(path: Path, text: str, heading: str, section: str = SECTION) -> None:
    """Replace (or add at the end of `section`) only the `### ` subsection `heading`."""
    previous = path.read_text() if path.exists() else ""
    if section not in previous:
        write_section(path, section + "\n\n" + text, section)
        return
    head, rest = previous.split(section, 1)
    nxt = rest.find("\n## ")
    body, tail = (rest[:nxt], rest[nxt + 1:]) if nxt >= 0 else (rest, "")
    if heading in body:
        before, after = body.split(heading, 1)
        end = after.find("\n### ")
        body = before.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n" + (after[end:] if end >= 0 else "")
    else:
        body = body.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    path.write_text(head + section + body.rstrip("\n") + "\n" + ("\n" + tail if tail else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--poll-interval", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=60.0, help="seconds per on/off window")
    parser.add_argument("--pairs", type=int, default=2, help="off/on window pairs")
    parser.add_argument("--skip", type=float, default=3.0, help="seconds left out at the start of each window")
    parser.add_argument("--metrics-rate", type=float, default=5.0,
                        help="/metrics requests per second in the second half of an \"on\" window")
    parser.add_argument("--scrape-interval", type=float, default=15.0,
                        help="seconds between /metrics requests in the first half (a Prometheus scrape)")
    parser.add_argument("--idle-window", type=float, default=30.0,
                        help="seconds of /metrics latency against a sidecar that does not poll (baseline)")
    parser.add_argument("--results", default=str(REPO / "bench" / "RESULTS.md"))
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="frs-bench-", dir="/tmp"))
    sockets, logs = work / "s", work / "logs"
    sockets.mkdir(parents=True, exist_ok=True)
    logs.mkdir(exist_ok=True)
    load_start = os.getloadavg()
    began = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    procs = start_ranks(args.ranks, work, sockets, logs)
    windows: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 600
        while not all((logs / f"warm-{r}").exists() for r in range(args.ranks)):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                raise SystemExit(f"ranks did not warm up; see {logs}")
            time.sleep(0.5)
        print(f"{args.ranks} ranks warm (recorders full); windows of {args.window:g} s", flush=True)
        idle = idle_latency(sockets, work, args)
        print(f"idle sidecar: /metrics p99 {idle['p99_ms']:.1f} ms", flush=True)
        for i in range(args.pairs):
            start = time.time()
            time.sleep(args.window)
            windows.append({"kind": "off", "start": start, "end": time.time()})
            print(f"off window {i + 1} done", flush=True)
            on = run_on_window(sockets, work, args)
            on["kind"] = "on"
            windows.append(on)
            print(f"on window {i + 1}: {on['cores']:.4f} cores, RSS {on['rss_max_mib']:.1f} MiB, "
                  f"/metrics p99 {on['metrics_p99_ms']:.1f} ms, {on['polls']:.0f} polls", flush=True)
        (logs / "stop").write_text("stop")
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    load_end = os.getloadavg()
    for w in windows:
        steps = steps_in(logs, args.ranks, w["start"] + args.skip, w["end"])
        w["steps"] = len(steps)
        w["step_median_ms"] = statistics.median(steps) * 1000
        w["step_mean_ms"] = statistics.fmean(steps) * 1000
    (work / "windows.json").write_text(json.dumps(windows, indent=1))

    on = [w for w in windows if w["kind"] == "on"]
    off = [w for w in windows if w["kind"] == "off"]

    def pooled(ws: list[dict[str, Any]], key: str) -> float:
        return statistics.fmean(w[key] for w in ws)

    cpu = sum(w["cpu_s"] for w in on) / sum(w["wall_s"] for w in on)
    per_round = sum(w["cpu_s"] for w in on) / max(1.0, sum(w["polls_cpu_half"] for w in on))
    med_on, med_off = pooled(on, "step_median_ms"), pooled(off, "step_median_ms")
    mean_on, mean_off = pooled(on, "step_mean_ms"), pooled(off, "step_mean_ms")
    noise = max(w["step_median_ms"] for w in off) / min(w["step_median_ms"] for w in off) - 1 if len(off) > 1 else 0
    lines = [
        SECTION,
        "",
        "Written by `bench/sidecar_overhead.py` (method in its docstring); every number below comes from one run.",
        "",
        f"- Run started {began}; {platform.processor() or platform.machine()}, `nproc` = {os.cpu_count()}; "
        f"load average at start {' / '.join(f'{x:.1f}' for x in load_start)}, at end "
        f"{' / '.join(f'{x:.1f}' for x in load_end)} (the machine is shared with other engineers' builds and "
        "tests: step times carry their load).",
        f"- Command: `.venv/bin/python bench/sidecar_overhead.py --ranks {args.ranks} --poll-interval "
        f"{args.poll_interval:g} --window {args.window:g} --pairs {args.pairs}`",
        f"- {args.ranks} gloo ranks on loopback, each recorder full (2,000 entries, fr_trace_json answer of "
        "~0.9 MB per rank), socket from the sitecustomize bootstrap; sidecar polls every "
        f"{args.poll_interval:g} s. CPU is measured over the first half of each \"on\" window (a /metrics "
        f"scrape every {args.scrape_interval:g} s, as Prometheus would), /metrics latency over the second half "
        f"(asked {args.metrics_rate:g}x a second, client side, loopback).",
        "",
        "| | target | measured |",
        "|---|---|---|",
        f"| sidecar CPU, polling + a scrape every {args.scrape_interval:g} s | <= 0.05 core | {cpu:.4f} core |",
        f"| sidecar CPU per poll round of {args.ranks} ranks (and idle time between rounds) | | "
        f"{per_round * 1000:.0f} ms = {per_round / args.poll_interval:.4f} core at one round per "
        f"{args.poll_interval:g} s |",
        f"| sidecar CPU, polling + /metrics {args.metrics_rate:g}x a second | | "
        f"{statistics.fmean(w['cores_with_metrics_load'] for w in on):.4f} core |",
        f"| sidecar RSS, max sampled (VmHWM) | <= 64 MiB | {max(w['rss_max_mib'] for w in on):.1f} MiB "
        f"({max(w['rss_hwm_mib'] for w in on):.1f} MiB) |",
        f"| /metrics latency p99 (p50) while polling, {sum(w['metrics_n'] for w in on)} requests | <= 20 ms | "
        f"{max(w['metrics_p99_ms'] for w in on):.1f} ms "
        f"({statistics.median(w['metrics_p50_ms'] for w in on):.1f} ms) |",
        f"| /metrics latency p99 (p50) of a sidecar that does not poll, {idle['n']} requests (this machine's "
        f"floor) | | {idle['p99_ms']:.1f} ms ({idle['p50_ms']:.1f} ms) |",
        f"| training step time, median: on vs off | within 1% | {med_on:.2f} ms vs {med_off:.2f} ms "
        f"({(med_on / med_off - 1) * 100:+.2f}%) |",
        f"| training step time, mean: on vs off | within 1% | {mean_on:.2f} ms vs {mean_off:.2f} ms "
        f"({(mean_on / mean_off - 1) * 100:+.2f}%) |",
        "",
        f"Noise floor: the median step time of the two \"off\" windows differs by {noise * 100:.2f}%. "
        f"Poll round (all {args.ranks} ranks: fetch, parse, normalize, track) took "
        f"{statistics.fmean(w['poll_round_mean_s'] for w in on) * 1000:.0f} ms on average; "
        f"{sum(w['polls'] for w in on):.0f} rounds measured. Sidecar exit codes after SIGTERM: "
        f"{sorted({w['exit_code'] for w in on})}.",
        "",
        HOW_TO_READ,
        "",
        "| window | steps | step median ms | step mean ms | sidecar cores | RSS max MiB | /metrics p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, w in enumerate(windows, 1):
        if w["kind"] == "on":
            lines.append(f"| {i} on | {w['steps']} | {w['step_median_ms']:.2f} | {w['step_mean_ms']:.2f} | "
                         f"{w['cores']:.4f} | {w['rss_max_mib']:.1f} | {w['metrics_p99_ms']:.1f} |")
        else:
            lines.append(f"| {i} off | {w['steps']} | {w['step_median_ms']:.2f} | {w['step_mean_ms']:.2f} | | | |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_section(Path(args.results), text)
    print(f"wrote the sidecar section of {args.results}; raw windows in {work / 'windows.json'}")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
