"""A small real data-parallel training job on gloo (one process per rank; torchrun or RANK/WORLD_SIZE/
MASTER_* set): an MLP, forward and backward on random data, the gradients all-reduced as one flat
bucket each step (what DDP does, through `torch.distributed.all_reduce`, so every torch version's
Python collectives carry it), a broadcast every 10 steps, SGD. `--ddp`: torch's own
DistributedDataParallel instead (its buckets are all-reduced from C++).

Used by the live-durations integration test (a healthy running job) and by bench/timing_overhead.py
(step time with frscope's bootstrap on and off). Prints one JSON line at the end on rank 0:
{"steps": N, "step_s": [...], "cpu_s": S}: each measured step's wall time, and the CPU time of the
whole process (every thread: gloo's too) over the measured steps.

    python -m frscope.testing.timed_train --seconds 60
    python -m frscope.testing.timed_train --steps 300 --warmup 30 --width 512
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=0.0, help="run this long (0: --steps)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20, help="steps not measured")
    parser.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds of sleep per step (data loading)")
    parser.add_argument("--ddp", action="store_true", help="torch's DistributedDataParallel")
    parser.add_argument("--backend", default="gloo", help="gloo (CPU tensors) or nccl (each rank on GPU LOCAL_RANK)")
    args = parser.parse_args()
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Sequential(
        torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
        torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
        torch.nn.Linear(args.width, 10)).to(device)
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    params = [p for p in model.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.01)
    flag = torch.zeros(1, device=device)
    torch.manual_seed(rank + 1)
    steps: list[float] = []
    end = time.monotonic() + args.seconds if args.seconds > 0 else None
    step = 0
    cpu_from = time.process_time()
    while (end is not None and time.monotonic() < end) or (end is None and step < args.steps + args.warmup):
        t0 = time.perf_counter()
        if args.pause:
            time.sleep(args.pause)
        x = torch.randn(args.batch, args.width, device=device)
        y = torch.randint(0, 10, (args.batch,), device=device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        if not args.ddp:
            grads = [p.grad for p in params if p.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat.div_(world)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        if step % 10 == 0:
            dist.broadcast(flag, src=0)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            steps.append(time.perf_counter() - t0)
        elif step == args.warmup - 1:
            cpu_from = time.process_time()
        step += 1
    cpu_s = time.process_time() - cpu_from
    dist.barrier()
    if rank == 0:
        print(json.dumps({"steps": len(steps), "step_s": steps, "cpu_s": cpu_s}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
