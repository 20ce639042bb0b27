#!/usr/bin/env python3
"""What `TORCH_NCCL_ENABLE_TIMING=1` (which frscope's webhook sets in the trainer) costs a training
step, measured side by side in one run. Needs >= 2 CUDA GPUs and torch with NCCL.

    python bench/nccl_timing.py                              # every GPU of this host
    python bench/nccl_timing.py --gpus 8 --blocks 40 --block-steps 25
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 bench/nccl_timing.py   # across hosts
    python bench/nccl_timing.py --gloo-dry-run --gpus 2      # the harness on CPUs (no NCCL: no difference)

How. Every rank builds two process groups over the same ranks and GPUs: `timing_off`, created while
TORCH_NCCL_ENABLE_TIMING=0, and `timing_on`, created while it is 1. ProcessGroupNCCL reads the
variable in its constructor (`enableTiming_`), so the two groups differ in that alone; the Flight
Recorder is on for both (TORCH_FR_BUFFER_SIZE, default 2000 here, as in the trainer). The steps
alternate between the groups in blocks (off on on off off on ...), so drift over the run (clocks,
temperature, other tenants) falls on both alike. A step's time is host wall time from before its
first launch to after `torch.cuda.synchronize()`; the step time of the job is the slowest rank's
(all ranks' times are gathered at the end). `enqueue` is the host time to launch the step's
collectives (before the synchronize): where a per-collective host cost shows first.

Workloads (one step each):
  tiny  --tiny-collectives all_reduces of 4 KiB and no compute: launch-bound, the worst case for a
        per-collective cost (many small collectives: tensor parallelism, parameter syncs);
  ddp   a compute "layer" (--ddp-matmul square matmuls of --ddp-dim), then --ddp-buckets all_reduces
        of 25 MiB (DDP's default bucket size): a data-parallel step.

Checks before the numbers count: the `timing_on` group's Flight Recorder entries carry `duration_ms`
and the `timing_off` group's do not; TORCH_NCCL_DESYNC_DEBUG / TORCH_DISTRIBUTED_DEBUG=DETAIL are
unset (either turns timing on for every group).

Output: the machine, then one Markdown table row per workload for bench/RESULTS.md ("NCCL timing").
The noise floor is the difference between the two halves (even and odd blocks) of the `off` arm: a
difference between the arms smaller than that is not a cost this run can show.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

WORKLOADS = ("tiny", "ddp")
BUCKET_BYTES = 25 * 1024 * 1024  # torch DDP's default bucket_cap_mb
TINY_BYTES = 4096
CHILD_VAR = "NCCL_TIMING_BENCH_CHILD"  # set on the ranks this script starts itself


@dataclass(frozen=True)
class Arm:
    name: str  # "off" / "on"
    group: Any  # torch.distributed.ProcessGroup


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--gpus", type=int, default=0, help="ranks to start on this host (default: every GPU)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of: " + ", ".join(WORKLOADS))
    p.add_argument("--blocks", type=int, default=40, help="blocks per workload, half of them per arm")
    p.add_argument("--block-steps", type=int, default=25, help="steps per block")
    p.add_argument("--warmup-steps", type=int, default=20, help="steps per arm before measuring")
    p.add_argument("--tiny-collectives", type=int, default=200)
    p.add_argument("--ddp-buckets", type=int, default=4)
    p.add_argument("--ddp-matmul", type=int, default=8)
    p.add_argument("--ddp-dim", type=int, default=4096)
    p.add_argument("--gloo-dry-run", action="store_true",
                   help="gloo on CPU tensors: checks the harness on a machine without GPUs; gloo ignores the "
                   "variable, so the two arms are the same and any difference is noise")
    p.add_argument("--port", type=int, default=0, help="rendezvous port when this script starts the ranks")
    return p.parse_args(argv)


# --- one rank --------------------------------------------------------------------------------------


def rank_main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    for var, bad in (("TORCH_NCCL_DESYNC_DEBUG", ("1", "true")), ("TORCH_DISTRIBUTED_DEBUG", ("DETAIL",))):
        if os.environ.get(var, "").strip() in bad:
            print(f"{var}={os.environ[var]} turns NCCL timing on for every group: unset it", file=sys.stderr)
            return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    if args.gloo_dry_run:
        device = torch.device("cpu")
        backend = "gloo"
    else:
        if torch.cuda.device_count() < 1:
            print("no CUDA device (use --gloo-dry-run to check the harness on CPUs)", file=sys.stderr)
            return 2
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    os.environ["TORCH_NCCL_ENABLE_TIMING"] = "0"
    dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    ranks = list(range(world))
    # ProcessGroupNCCL reads TORCH_NCCL_ENABLE_TIMING when it is constructed: one group each way.
    off = dist.new_group(ranks=ranks, group_desc="timing_off")
    os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"
    on = dist.new_group(ranks=ranks, group_desc="timing_on")
    os.environ["TORCH_NCCL_ENABLE_TIMING"] = "0"
    arms = (Arm("off", off), Arm("on", on))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    results: dict[str, Any] = {}
    for workload in [w for w in args.workloads.split(",") if w]:
        if workload not in WORKLOADS:
            raise SystemExit(f"unknown workload {workload!r}")
        step = make_step(workload, args, device)
        for arm in arms:  # warm-up: communicators, NCCL's first-use setup, allocator
            for _ in range(args.warmup_steps):
                step(arm.group)
            sync()
        times: dict[str, list[float]] = {"off": [], "on": []}
        enqueue: dict[str, list[float]] = {"off": [], "on": []}
        half: dict[str, list[int]] = {"off": [], "on": []}  # which half (even/odd block of the arm) a step is in
        seen = {"off": 0, "on": 0}
        for block in range(args.blocks):
            arm = arms[(block + block // 2) % 2]  # off on on off off on on ...
            dist.barrier(group=off)
            sync()
            for _ in range(args.block_steps):
                t0 = time.perf_counter()
                step(arm.group)
                t1 = time.perf_counter()
                sync()
                t2 = time.perf_counter()
                times[arm.name].append(t2 - t0)
                enqueue[arm.name].append(t1 - t0)
                half[arm.name].append(seen[arm.name] % 2)
            seen[arm.name] += 1
        # The job's step time is its slowest rank's: gather every rank's times, keep the max per step.
        gathered = gather_json((times, enqueue), world, device)
        if rank == 0:
            results[workload] = {
                "collectives_per_step": args.tiny_collectives if workload == "tiny" else args.ddp_buckets,
                "arms": {
                    name: {
                        "step_s": [max(g[0][name][i] for g in gathered) for i in range(len(times[name]))],
                        "enqueue_s": [max(g[1][name][i] for g in gathered) for i in range(len(enqueue[name]))],
                        "half": half[name],
                    }
                    for name in ("off", "on")
                },
            }
    time.sleep(0.5)  # the watchdog retires completed work (and computes durations) every 100 ms
    checks = gather_json(recorded_durations(backend), world, device)
    if rank == 0:
        info = {
            "torch": torch.__version__,
            "nccl": nccl_version() if backend == "nccl" else "-",
            "device": torch.cuda.get_device_name(device) if backend == "nccl" else platform.processor() or "cpu",
            "world": world,
            "hosts": len({c["host"] for c in checks}),
            "backend": backend,
            "checks": checks,
        }
        data = {"info": info, "results": results}
        if os.environ.get(CHILD_VAR):
            print("NCCL_TIMING_RESULT " + json.dumps(data), flush=True)  # for the launcher's report
        else:
            report(data, args)  # under torchrun: rank 0 reports
    dist.barrier()
    dist.destroy_process_group()
    return 0


def nccl_version() -> str:
    import torch

    version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # a tuple in recent torch, an int (2.18.3 -> 21803) in older ones
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def gather_json(obj: Any, world: int, device: Any) -> list[Any]:
    """Every rank's `obj` (JSON-able), on every rank. (all_gather_object needs numpy; this does not.)"""
    import torch
    import torch.distributed as dist

    raw = json.dumps(obj).encode()
    size = torch.tensor([len(raw)], dtype=torch.int64, device=device)
    dist.all_reduce(size, op=dist.ReduceOp.MAX)
    mine = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    mine[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8, device=device)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    return [json.loads(bytes(p.cpu().tolist()).rstrip(b"\0")) for p in parts]


def make_step(workload: str, args: argparse.Namespace, device: Any) -> Any:
    import torch
    import torch.distributed as dist

    if workload == "tiny":
        tensors = [torch.ones(TINY_BYTES // 4, device=device) for _ in range(args.tiny_collectives)]

        def tiny(group: Any) -> None:
            for t in tensors:
                dist.all_reduce(t, group=group)

        return tiny
    dim = args.ddp_dim if device.type == "cuda" else min(args.ddp_dim, 256)
    x = torch.randn(dim, dim, device=device) / dim**0.5
    buckets = [torch.ones(BUCKET_BYTES // 4, device=device) for _ in range(args.ddp_buckets)]

    def ddp(group: Any) -> None:
        y = x
        for _ in range(args.ddp_matmul):
            y = torch.tanh(y @ x)
        for b in buckets:
            dist.all_reduce(b, group=group)

    return ddp


def recorded_durations(backend: str) -> dict[str, Any]:
    """How many Flight Recorder entries of each group carry a duration: the `on` group's must, the
    `off` group's must not (else timing was not what this run compared)."""
    from torch._C import _distributed_c10d as c10d

    out: dict[str, Any] = {"host": socket.gethostname()}
    dump = getattr(c10d, "_dump_nccl_trace_json" if backend == "nccl" else "_dump_fr_trace_json", None)
    if dump is None:
        out["error"] = "this torch has no JSON recorder dump"
        return out
    try:
        trace = json.loads(dump(includeCollectives=True, onlyActive=False))
    except Exception as exc:  # report, do not hide: the comparison needs this check
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    for entry in trace.get("entries") or []:
        desc = (entry.get("process_group") or ["", ""])[1]
        if desc not in ("timing_off", "timing_on"):
            continue
        row = out.setdefault(desc, {"entries": 0, "with_duration": 0})
        row["entries"] += 1
        if entry.get("duration_ms") is not None:
            row["with_duration"] += 1
    return out


# --- the launcher and the report ---------------------------------------------------------------------


def launch(args: argparse.Namespace) -> int:
    n = args.gpus
    if n <= 0:
        if args.gloo_dry_run:
            n = 2
        else:
            try:
                import torch

                n = torch.cuda.device_count()
            except ImportError:
                n = 0
    if n < 2:
        print(f"needs >= 2 ranks (GPUs found: {n}); nothing was measured", file=sys.stderr)
        return 2
    port = args.port or free_port()
    procs = []
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
               "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), CHILD_VAR: "1"}
        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env=env,
                                      stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, text=True))
    out, _ = procs[0].communicate()
    codes = [procs[0].returncode] + [p.wait() for p in procs[1:]]
    if any(codes):
        print(f"ranks exited with {codes}", file=sys.stderr)
        return 1
    line = next((x for x in out.splitlines() if x.startswith("NCCL_TIMING_RESULT ")), None)
    if line is None:
        print("rank 0 printed no result", file=sys.stderr)
        return 1
    report(json.loads(line.split(" ", 1)[1]), args)
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(a: float, b: float) -> str:
    return f"{(b / a - 1) * 100:+.2f}%"


def report(data: dict[str, Any], args: argparse.Namespace) -> None:
    info = data["info"]
    problems = []
    for check in info["checks"]:
        if "error" in check:
            problems.append(f"{check['host']}: {check['error']}")
            continue
        on, off = check.get("timing_on", {}), check.get("timing_off", {})
        if info["backend"] == "nccl" and not (on.get("with_duration") and not off.get("with_duration")):
            problems.append(f"{check['host']}: durations recorded on={on} off={off}: the groups did not differ "
                            "in timing as intended")
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# NCCL timing: {info['world']} ranks on {info['hosts']} host(s), {info['device']}; torch {info['torch']}, "
          f"NCCL {info['nccl']}, backend {info['backend']}; {started}")
    print(f"# command: {' '.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])}")
    print(f"# blocks {args.blocks} x {args.block_steps} steps, alternating off/on; step = slowest rank's host wall "
          "time to torch.cuda.synchronize(); enqueue = host time to launch the step's collectives")
    for problem in problems:
        print(f"# CHECK FAILED: {problem}")
    if info["backend"] != "nccl":
        print("# gloo dry run: gloo ignores TORCH_NCCL_ENABLE_TIMING; any difference below is noise")
    print("| workload | collectives per step | off: step median (p90) ms | on: step median (p90) ms | on vs off "
          "| noise floor (off vs off) | enqueue per collective off / on µs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for workload, r in data["results"].items():
        arms = r["arms"]
        med = {k: statistics.median(v["step_s"]) * 1e3 for k, v in arms.items()}
        p90 = {k: statistics.quantiles(v["step_s"], n=10)[-1] * 1e3 for k, v in arms.items()}
        per = {k: statistics.median(v["enqueue_s"]) / r["collectives_per_step"] * 1e6 for k, v in arms.items()}
        off = arms["off"]
        halves = [[s for s, h in zip(off["step_s"], off["half"], strict=True) if h == i] for i in (0, 1)]
        floor = pct(statistics.median(halves[0]), statistics.median(halves[1])) if all(halves) else "-"
        print(f"| {workload} | {r['collectives_per_step']} | {med['off']:.3f} ({p90['off']:.3f}) | "
              f"{med['on']:.3f} ({p90['on']:.3f}) | {pct(med['off'], med['on'])} | {floor} | "
              f"{per['off']:.1f} / {per['on']:.1f} |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # a rank: started by launch() or by torchrun
        return rank_main(args)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
