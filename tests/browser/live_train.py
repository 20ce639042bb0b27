"""One rank of a healthy, long-running real gloo job for the live-window tests: every step an all_reduce
of a [256, 256] float32 tensor and a broadcast, ~5 steps a second, for `--seconds`; rank `--slow-rank`
takes 40 ms longer before each step (slow, never hung). Torch's worker server answers on
`<socket-dir>/rank-<RANK>.sock`, as in a pod with frscope's bootstrap, so a real `frscope sidecar` reads it.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _WorkerServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket-dir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--slow-rank", type=int, default=2)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    server = _WorkerServer(str(args.socket_dir / f"rank-{rank}.sock"))
    grad = torch.ones(256, 256)
    flag = torch.zeros(4)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(0.2 + (0.04 if rank == args.slow_rank else 0.0))
        dist.all_reduce(grad)
        grad.div_(dist.get_world_size())
        dist.broadcast(flag, src=0)
    dist.barrier()
    server.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
