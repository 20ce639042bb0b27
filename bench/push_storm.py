#!/usr/bin/env python3
"""A push storm at the real operator, which is killed once in the middle of it (issue 15).

When the watchdog fires in a 1,250-pod job, every sidecar pushes its evidence within seconds. What runs
(each in its own process, ended by PID):
- the real kube-apiserver + etcd from testenv with the PyTorchJob and report CRDs; one job of N pods (one
  rank each) created through the API, each pod's status patched like a kubelet's;
- the sidecar farm of `bench/operator_scale.py` (N aiohttp sites on loopback serving synthetic NCCL-shaped
  recorders, scenario `not_joined`: a known culprit), so the operator's gathers find live sidecars;
- `frscope operator --evidence-dir DIR --sidecar-auth none`;
- the storm, in this process: N instances of the sidecar's own `frscope.sidecar.push.Pusher` (its retries,
  backoff and Retry-After handling as shipped, default 5 tries), each pushing its pod's full recorder
  (the farm's body with reason `stall`, as a sidecar's stall capture) at a moment spread evenly over
  `--storm-s` seconds.
`--kill-at` seconds into the storm the operator is SIGKILLed and started again at once on the same port
and evidence dir.

Measured: the share of pushes accepted (a 2xx) in the end, how many tries were retried (429 or no
operator), how many pushes the restarted operator read back from its evidence dir, each operator
incarnation's peak RSS (with its decode workers), and the condition on the job (the planted culprit?)
with the time from the storm's start.

    .venv/bin/python bench/push_storm.py --pods 1250             # prints a table, appends it to RESULTS.md
    .venv/bin/python bench/push_storm.py --pods 64 --no-results  # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import importlib.util
import json
import logging
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "RESULTS.md"
SECTION = "## Issue 15: a push storm at the operator, killed once mid-storm"


def load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


scale = load("frscope_bench_operator_scale", REPO / "bench" / "operator_scale.py")


def start_operator(kubeconfig: Path, port: int, evidence: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.Popen([sys.executable, "-m", "frscope", "operator", "--http-host", "127.0.0.1",
                             "--http-port", str(port), "--poll-interval", "5", "--namespace", "bench",
                             "--sidecar-auth", "none", "--evidence-dir", str(evidence)],
                            env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=REPO)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def wait_ready(op: subprocess.Popen[bytes], base: str, pods: int, log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if op.poll() is not None:
            raise SystemExit(f"the operator exited:\n{log.read_text()[-3000:]}")
        try:
            if scale.metric(get(base + "/metrics"), "frscope_operator_pods_watched") == pods:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the operator did not see every pod in time")
        time.sleep(0.5)


async def fetch_bodies(ports: dict[str, int]) -> dict[str, bytes]:
    """Each pod's full recorder from the farm, as its sidecar's stall capture would push it."""
    import aiohttp

    out: dict[str, bytes] = {}
    limit = asyncio.Semaphore(16)
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async def one(pod: str, port: int) -> None:
            async with limit, session.get(f"http://127.0.0.1:{port}/v1/snapshot") as r:
                raw = gzip.decompress(await r.read())
            out[pod] = await asyncio.to_thread(
                gzip.compress, raw.replace(b'"reason": "refresh"', b'"reason": "stall"', 1), 1)

        await asyncio.gather(*(one(pod, port) for pod, port in ports.items()))
    return out


async def storm(bodies: dict[str, bytes], url: str, storm_s: float) -> tuple[dict[str, int], float]:
    """Every pod's push, spread over `storm_s`; returns the sidecars' push counters and the time the last
    pusher gave up or was answered."""
    from prometheus_client import CollectorRegistry

    from frscope.sidecar.config import SidecarConfig
    from frscope.sidecar.metrics import SidecarMetrics
    from frscope.sidecar.push import Pusher

    defaults = SidecarConfig()
    logging.getLogger("frscope.sidecar").setLevel(logging.CRITICAL)  # 1,000s of retry lines otherwise
    metrics = SidecarMetrics(CollectorRegistry())
    started = time.monotonic()

    async def one(i: int, pod: str, body: bytes) -> None:
        pusher = Pusher(url, token=lambda: None, pod=pod, namespace="bench", timeout_s=defaults.push_timeout_s,
                        attempts=defaults.push_attempts, backoff_s=defaults.push_backoff_s, metrics=metrics)
        await asyncio.sleep(storm_s * i / max(1, len(bodies)))
        pusher.submit("stall", body)
        task = asyncio.create_task(pusher.run())
        await pusher.queue.join()
        task.cancel()

    await asyncio.gather(*(one(i, pod, body) for i, (pod, body) in enumerate(bodies.items())))
    counts = {result: int(metrics.pushes.labels(result=result)._value.get())
              for result in ("ok", "retry", "failed", "dropped")}
    return counts, time.monotonic() - started


def run(args: argparse.Namespace) -> dict[str, Any]:
    cluster = scale.load_cluster()
    crd_dir = scale.bin_dir().parent / "crds"
    crds = [next(iter(sorted(crd_dir.glob("kubeflow.org_pytorchjobs.yaml")))),
            REPO / "charts/frscope/crds/flightrecorderreport.yaml"]
    work = Path(tempfile.mkdtemp(prefix="frscope-storm-"))
    evidence = work / "evidence"
    port_file = work / "ports.json"
    procs: list[subprocess.Popen[bytes]] = []
    plane = None
    try:
        farm_log = open(work / "farm.log", "wb")
        procs.append(subprocess.Popen([sys.executable, str(REPO / "bench" / "operator_scale.py"), "farm",
                                       "--ranks", str(args.pods), "--entries", str(args.entries),
                                       "--port-file", str(port_file), "--seed", str(args.seed)],
                                      stdout=farm_log, stderr=subprocess.STDOUT, cwd=REPO))
        plane = cluster.start(scale.bin_dir(), crds=[], controller_manager=False)
        for crd in crds:
            plane.kubectl("apply", "-f", str(crd))
        deadline = time.monotonic() + args.farm_timeout
        while not port_file.exists():
            if procs[0].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the farm did not start:\n{(work / 'farm.log').read_text()[-3000:]}")
            time.sleep(1)
        farm_info = json.loads(port_file.read_text())
        ports, truth = farm_info["ports"], farm_info["truth"]
        asyncio.run(scale.create_objects(plane.server, plane.admin_token, plane.ca_file, ports, args.pods))
        bodies = asyncio.run(fetch_bodies(ports))
        raw_mib = sum(len(gzip.decompress(b)) for b in bodies.values()) / 2**20
        print(f"{len(bodies)} push bodies, {raw_mib:.0f} MiB of JSON", file=sys.stderr, flush=True)

        http_port = cluster.free_port()
        base = f"http://127.0.0.1:{http_port}"
        op_log = work / "operator.log"
        op = start_operator(plane.kubeconfig, http_port, evidence, op_log)
        procs.append(op)
        wait_ready(op, base, args.pods, op_log)
        # The job hangs: every sidecar reports the stall (the status sweep) and pushes its capture.
        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{next(iter(ports.values()))}/control/stall", method="POST"), timeout=10).close()
        peaks = [0, 0]
        t0 = time.monotonic()
        killed: dict[str, Any] = {}
        seen: dict[str, Any] = {}  # the condition on the job, and when it was first seen

        async def storm_and_kill() -> tuple[dict[str, int], float]:
            async def killer() -> None:
                nonlocal op
                while time.monotonic() - t0 < args.kill_at:
                    peaks[0] = max(peaks[0], scale.tree_rss_kib(op.pid))
                    await asyncio.sleep(0.2)
                try:
                    text = await asyncio.to_thread(get, base + "/metrics")
                    accepted = scale.metric(text, 'frscope_operator_pushes_total{result="accepted"}') or 0
                except OSError:  # too busy to answer in 10 s: the files on disk still say
                    accepted = float("nan")
                peaks[0] = max(peaks[0], scale.rss_kib(op.pid, "VmHWM") + sum(
                    scale.rss_kib(c) for c in scale.children(op.pid)))
                for child in scale.children(op.pid):
                    os.kill(child, signal.SIGKILL)
                op.kill()
                op.wait()
                killed.update(at_s=time.monotonic() - t0, accepted_before=accepted,
                              files=len(list(evidence.glob("*.json.gz"))))
                op = start_operator(plane.kubeconfig, http_port, evidence, op_log)
                procs.append(op)
                while True:
                    peaks[1] = max(peaks[1], scale.tree_rss_kib(op.pid))
                    await asyncio.sleep(0.2)

            async def condition_watch() -> None:
                while True:
                    job = await asyncio.to_thread(plane.kubectl_json, "get", "pytorchjob", "bench", "-n", "bench")
                    found = [c for c in job.get("status", {}).get("conditions", [])
                             if c["type"] == "CollectiveTimeoutDiagnosed"]
                    if found:
                        seen.update(condition=found[0], at_s=time.monotonic() - t0)
                        return
                    await asyncio.sleep(0.5)

            watch = asyncio.create_task(killer())
            looking = asyncio.create_task(condition_watch())
            try:
                return await storm(bodies, base, args.storm_s)
            finally:
                watch.cancel()
                looking.cancel()

        counts, storm_took = asyncio.run(storm_and_kill())
        condition = seen.get("condition")
        while condition is None and time.monotonic() - t0 < args.timeout:
            peaks[1] = max(peaks[1], scale.tree_rss_kib(op.pid))
            job = plane.kubectl_json("get", "pytorchjob", "bench", "-n", "bench")
            found = [c for c in job.get("status", {}).get("conditions", [])
                     if c["type"] == "CollectiveTimeoutDiagnosed"]
            if found:
                condition = found[0]
                seen["at_s"] = time.monotonic() - t0
            time.sleep(0.5)
        elapsed = seen.get("at_s", float("nan"))
        text = op_log.read_text(errors="replace")
        reloaded = re.findall(r"evidence dir \S+: (\d+) push\(es\) kept from before", text)
        peaks[1] = max(peaks[1], scale.rss_kib(op.pid, "VmHWM"))
        result = {
            "pods": args.pods, "entries": args.entries, "json_mib": raw_mib, "storm_s": args.storm_s,
            "accepted": counts["ok"], "retries": counts["retry"], "failed": counts["failed"],
            "storm_took_s": storm_took, "killed_at_s": killed.get("at_s", float("nan")),
            "accepted_before_kill": killed.get("accepted_before", 0), "files_at_kill": killed.get("files", 0),
            "reloaded": int(reloaded[-1]) if reloaded else 0,
            "peak_before_mib": peaks[0] / 1024, "peak_after_mib": peaks[1] / 1024,
            "condition_s": elapsed, "verdict": "timed out",
            "load": os.getloadavg()[0],
        }
        if condition:
            ok = (condition["reason"] == truth["category"]
                  and f"Rank {truth['culprit_ranks'][0]} " in condition["message"])
            said = "planted culprit" if ok else "WRONG: " + condition["message"][:80]
            result["verdict"] = f"{condition['reason']} ({said})"
        print(json.dumps(result), flush=True)
        return result
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                for child in scale.children(proc.pid):
                    try:
                        os.kill(child, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if plane is not None:
            plane.stop()
        print(f"logs in {work}", file=sys.stderr)


def write_results(r: dict[str, Any], command: str, commit: str) -> None:
    lines = [
        SECTION, "",
        f"`{command}` at commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{r['load']:.1f} at the end. What runs: see the script's docstring (real API server, the operator's "
        "own process killed with SIGKILL and started again, the sidecar's own `Pusher` with its shipped "
        "retries).", "",
        "| pods | JSON pushed | storm | accepted | retried tries | gave up | killed at (accepted / files kept by then) "
        "| read back after the restart | peak RSS before / after the kill | condition | verdict |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---|",
        f"| {r['pods']:,} | {r['json_mib']:.0f} MiB "
        f"| {r['storm_s']:g} s (all answered after {r['storm_took_s']:.0f} s) "
        f"| {r['accepted']:,} ({100 * r['accepted'] / r['pods']:.1f}%) | {r['retries']:,} | {r['failed']:,} "
        f"| {r['killed_at_s']:.1f} s ({r['accepted_before_kill']:,.0f} / {r['files_at_kill']:,}) | {r['reloaded']:,} "
        f"| {r['peak_before_mib']:.0f} / {r['peak_after_mib']:.0f} MiB | {r['condition_s']:.0f} s | {r['verdict']} |",
        "",
    ]
    section = "\n".join(lines)
    text = RESULTS.read_text()
    start = text.find(SECTION + "\n")
    if start >= 0:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=1250)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--storm-s", type=float, default=5.0, help="the pushes start evenly over this many seconds")
    parser.add_argument("--kill-at", type=float, default=2.5, help="seconds into the storm the operator is killed")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds from the storm to wait for the condition")
    parser.add_argument("--farm-timeout", type=float, default=1800.0)
    parser.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    args = parser.parse_args()
    result = run(args)
    if not args.no_results:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=REPO, check=False).stdout.strip()
        write_results(result, "python bench/push_storm.py " + " ".join(sys.argv[1:]), commit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
