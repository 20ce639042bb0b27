"""The training script of bench/rank_cost.py: fixed-compute gloo steps, timed inside the rank.

An ordinary gloo data-parallel loop with no frscope in it (the worker-server socket comes from the
sitecustomize bootstrap on PYTHONPATH). It fills the Flight Recorder (2,100 collectives: the ring of
2,000 entries is full), writes `<log dir>/warm-<rank>`, then runs steps until `<log dir>/stop`
exists: 8 matmuls of SIZE x SIZE (one thread) and one 64 KiB all_reduce. Steps are contiguous (a
step starts where the previous one ended), so the job's step is the interval between two of rank 0's
step ends: every rank's all_reduce waits for the slowest rank, so a delay on any rank shows there.

Per step it keeps (written to `<log dir>/steps-<rank>.txt` at the end, nothing written while
stepping): end of the step (wall clock, `time.time()`), step seconds, compute seconds (the matmuls,
before the all_reduce), the training thread's CPU seconds (`time.thread_time()`) and the whole
process's CPU seconds (`time.process_time()`: every thread, so the worker server's threads answering
a request too) spent in the step.

A second Python thread (the "GIL probe") sleeps 2 ms in a loop and keeps every wake-up that came
more than 1 ms late (`<log dir>/gil-<rank>.txt`: wall time, lateness): a thread waiting for the GIL
(or for a CPU) shows there, so a request whose handler holds the GIL makes it late.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist


def gil_probe(out: list[tuple[float, float]], stop: threading.Event) -> None:
    nap = 0.002
    while not stop.is_set():
        t0 = time.perf_counter()
        time.sleep(nap)
        late = time.perf_counter() - t0 - nap
        if late > 0.001:
            out.append((time.time(), late))


def safety_net() -> None:
    time.sleep(1800)
    os._exit(3)


def main() -> int:
    log_dir = Path(sys.argv[1])
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    fill = 2100
    threading.Thread(target=safety_net, daemon=True).start()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tiny = torch.ones(8)
    for _ in range(fill):
        dist.all_reduce(tiny)
    x0 = torch.randn(size, size) / size**0.5
    grads = torch.randn(16384)
    late: list[tuple[float, float]] = []
    halt = threading.Event()
    probe = threading.Thread(target=gil_probe, args=(late, halt), daemon=True)
    probe.start()
    (log_dir / f"warm-{rank}").write_text("warm")
    stop = log_dir / "stop"
    rows: list[tuple[float, float, float, float, float]] = []
    step = 0
    t_prev, c_prev, p_prev = time.perf_counter(), time.thread_time(), time.process_time()
    while True:
        if step % 50 == 0:  # decided together, so that every rank leaves at the same step
            flag = torch.tensor([1.0 if stop.exists() else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                break
        x = x0
        for _ in range(8):
            x = torch.tanh(x @ x0)
        t_mid = time.perf_counter()
        dist.all_reduce(grads)
        t_end, c_end, p_end = time.perf_counter(), time.thread_time(), time.process_time()
        rows.append((time.time(), t_end - t_prev, t_mid - t_prev, c_end - c_prev, p_end - p_prev))
        t_prev, c_prev, p_prev = t_end, c_end, p_end
        step += 1
    halt.set()
    probe.join()
    with open(log_dir / f"steps-{rank}.txt", "w") as log:
        log.writelines(" ".join(f"{v:.7f}" for v in row) + "\n" for row in rows)
    with open(log_dir / f"gil-{rank}.txt", "w") as log:
        log.writelines(f"{t:.6f} {d:.6f}\n" for t, d in late)
    (log_dir / f"done-{rank}").write_text(str(step))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
