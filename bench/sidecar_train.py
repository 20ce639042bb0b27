"""The training script of the sidecar overhead benchmark (bench/sidecar_overhead.py).

An ordinary gloo data-parallel loop with no frscope in it: the worker-server socket comes from the
sitecustomize bootstrap on PYTHONPATH. It first fills the Flight Recorder (2,000+ collectives), writes
`<log dir>/warm-<rank>`, then runs steps (a little compute + one all_reduce) until `<log dir>/stop`
exists, logging `<end time> <step seconds>` per step to `<log dir>/steps-<rank>.txt`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> int:
    log_dir = Path(sys.argv[1])
    fill = int(sys.argv[2]) if len(sys.argv) > 2 else 2100
    threading.Thread(target=lambda: (time.sleep(1800), os._exit(3)), daemon=True).start()  # safety net
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tiny = torch.ones(8)
    for _ in range(fill):
        dist.all_reduce(tiny)
    (log_dir / f"warm-{rank}").write_text("warm")
    x = torch.randn(96, 96)
    grads = torch.randn(16384)
    stop = log_dir / "stop"
    step = 0
    with open(log_dir / f"steps-{rank}.txt", "w", buffering=1 << 16) as log:
        while True:
            if step % 50 == 0:  # decided together, so that every rank leaves at the same step
                flag = torch.tensor([1.0 if stop.exists() else 0.0])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                if flag.item() > 0:
                    break
            t0 = time.perf_counter()
            for _ in range(8):
                x = torch.tanh(x @ x) * 0.5
            dist.all_reduce(grads)
            log.write(f"{time.time():.6f} {time.perf_counter() - t0:.6f}\n")
            step += 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
