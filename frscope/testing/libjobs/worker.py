"""One rank of a library-driven real job: torch's own parallelism libraries on gloo, with a fault.

Run as a script by `frscope.testing.libjobs.launch` under any torch venv (2.13, 2.14, 2.15): it imports
torch and the standard library only, never frscope. Programs drive the libraries the way training code
does (DDP with no_sync and unused parameters, FSDP2, DTensor tensor parallel, a 3-D DeviceMesh, DCP save,
object collectives, scatter/gather, monitored_barrier, pipelining schedules, a DataLoader worker), so the
recorder holds the shapes those libraries really leave (two-op object collectives, DDP's rebroadcast,
`[]` scatter inputs, mesh_* groups, ...).

Faults (`--fault KIND:RANK:STEP`): `stuck` (the rank sleeps in `load_batch` at that step), `stuckmid` (the
same after the step's first op: in front of a monitored_barrier, an object collective's second op, a
gather after its scatter), `crash` (the
rank's process ends with os._exit(17) there, no dump), `loader` (the rank's DataLoader worker hangs), and
`none`. Capture: every rank keeps a thread that, when the launcher writes `<out>/trigger`, writes its
recorder as torch's JSON and pickle and every thread's stack (faulthandler's format, as the worker server's
dump_traceback gives it); a healthy rank writes them itself when its program ends.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

STEPS = 6


class Rank:
    def __init__(self, args: argparse.Namespace) -> None:
        self.rank, self.world = args.rank, args.world
        self.out = Path(args.out)
        kind, _, rest = args.fault.partition(":")
        self.fault = kind
        at_rank, _, at_step = rest.partition(":")
        self.fault_rank = int(at_rank) if at_rank else -1
        self.fault_step = int(at_step) if at_step else -1
        self.dumped = threading.Lock()
        self.done = False

    def faulty(self, step: int, kinds: tuple[str, ...] = ("stuck", "crash")) -> bool:
        return self.fault in kinds and self.rank == self.fault_rank and step == self.fault_step

    def mid_step(self, step: int) -> None:
        """`stuckmid`: the rank gets stuck after its step's first collective, before the next op."""
        if self.faulty(step, ("stuckmid",)):
            (self.out / f"fault-{self.rank}").write_text(str(time.time_ns()))
            load_batch()

    def at_step(self, step: int) -> None:
        """Where a fault strikes: at the start of a step, before its first collective. Every rank also
        writes a periodic dump at step 1, as jobs that keep one do: a rank that dies leaves it behind."""
        if step == 1 and not self.dumped.locked():
            self.dump("periodic", final=False)
        if not self.faulty(step):
            return
        (self.out / f"fault-{self.rank}").write_text(str(time.time_ns()))
        if self.fault == "crash":
            os._exit(17)
        load_batch()

    def dump(self, reason: str, final: bool = True) -> None:
        """`final`: the capture (once); otherwise a periodic dump, which a later one replaces."""
        if final and not self.dumped.acquire(blocking=False):
            return
        from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json  # type: ignore[attr-defined]

        captured = time.time_ns()
        (self.out / f"rank_{self.rank}.json").write_bytes(_as_bytes(_dump_fr_trace_json(True, False)))
        (self.out / f"rank_{self.rank}.pkl").write_bytes(_as_bytes(_dump_fr_trace(True, True, False)))
        with open(self.out / f"rank_{self.rank}.stack.txt", "w") as f:
            faulthandler.dump_traceback(f, all_threads=True)
        marker = f"captured-{self.rank}" if final else f"periodic-{self.rank}"
        (self.out / marker).write_text(json.dumps({"captured_at_ns": captured, "reason": reason}))

    def watch(self) -> None:
        trigger = self.out / "trigger"
        while not trigger.exists():
            time.sleep(0.05)
        self.dump("trigger")


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def load_batch() -> None:
    """A data loader that never returns (the stuck rank's frame)."""
    while True:
        time.sleep(3600)


def _mlp(width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))


def ddp(r: Rank) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
            out: torch.Tensor = self.b(self.a(x)) if use_b else self.a(x)
            return out

    torch.manual_seed(0)
    model = DDP(Branchy(), find_unused_parameters=True, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        r.at_step(step)
        x = torch.randn(4, 16)
        if step % 2 == 0:
            with model.no_sync():  # gradient accumulation: no collective for this micro-batch
                model(x, True).sum().backward()
        model(x, step % 3 != 0).sum().backward()
        opt.step()
        opt.zero_grad()


def fsdp2(r: Rank) -> None:
    from torch.distributed.fsdp import fully_shard

    model = _mlp()
    for layer in list(model.children()):
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        r.at_step(step)
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def tensor_parallel(r: Rank) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (r.world,), mesh_dim_names=("tp",))
    width = math.lcm(16, r.world)  # the sharded dimension divides evenly among the ranks (DTensor needs it here)
    model = parallelize_module(_mlp(width), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        r.at_step(step)
        torch.manual_seed(step)
        model(torch.randn(4, width)).sum().backward()
        opt.step()
        opt.zero_grad()


def mesh3d(r: Rank) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    shape = (2, 2, r.world // 4) if r.world % 4 == 0 else (1, 2, r.world // 2)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("pp", "dp", "tp"))
    groups = [mesh.get_group(d) for d in ("tp", "dp", "pp")]
    for step in range(STEPS):
        r.at_step(step)
        for i, group in enumerate(groups):
            dist.all_reduce(torch.ones(8 * (i + 1)), group=group)
        dist.all_reduce(torch.ones(2))


def dcp_save(r: Rank) -> None:
    import torch.distributed.checkpoint as dcp

    model = _mlp()
    for step in range(STEPS):
        r.at_step(step)
        grads = [p.detach().clone() for p in model.parameters()]
        for g in grads:
            dist.all_reduce(g)
        if step % 2 == 1:
            dcp.save({"model": model.state_dict()},  # type: ignore[attr-defined]
                     checkpoint_id=str(r.out / "ckpt" / f"step{step}"))


def objects(r: Rank) -> None:
    for step in range(STEPS):
        r.at_step(step)
        gathered: list[Any] = [None] * r.world
        dist.all_gather_object(gathered, {"rank": r.rank, "step": step})
        r.mid_step(step)
        box: list[Any] = [{"lr": 0.1 * step}] if r.rank == 0 else [None]
        dist.broadcast_object_list(box, src=0)
        dist.gather_object({"loss": float(step)}, [None] * r.world if r.rank == 0 else None, dst=0)
        got: list[Any] = [None]
        dist.scatter_object_list(got, [{"shard": i} for i in range(r.world)] if r.rank == 0 else None, src=0)
        dist.all_reduce(torch.ones(4))


def scatter_gather(r: Rank) -> None:
    for step in range(STEPS):
        r.at_step(step)
        root = step % r.world
        out = torch.empty(4)
        dist.scatter(out, [torch.full((4,), float(i)) for i in range(r.world)] if r.rank == root else None, src=root)
        r.mid_step(step)
        dist.gather(out, [torch.empty(4) for _ in range(r.world)] if r.rank == root else None, dst=root)
        dist.all_reduce(out)


def monitored(r: Rank) -> None:
    for step in range(STEPS):
        r.at_step(step)
        dist.all_reduce(torch.ones(16))
        r.mid_step(step)
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=120), wait_all_ranks=True)


def pipeline(r: Rank) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(0)
    stage_mod = nn.Linear(16, 16)
    stage = PipelineStage(stage_mod, r.rank, r.world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, _t: out.sum())
    for step in range(STEPS):
        r.at_step(step)
        x = torch.randn(4, 16)
        if r.rank == 0:
            schedule.step(x)
        elif r.rank == r.world - 1:
            schedule.step(target=x)
        else:
            schedule.step()
        r.mid_step(step)
        dist.all_reduce(torch.ones(4))


class _Slow(torch.utils.data.Dataset[torch.Tensor]):
    """A dataset whose worker process hangs at item 12 (batch 3) on the faulty rank."""

    def __init__(self, hang: bool, marker: Path) -> None:
        self.hang = hang
        self.marker = marker

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.hang and i >= 12:
            self.marker.write_text(str(time.time_ns()))
            load_batch()
        ones: torch.Tensor = torch.ones(16)
        return ones


def dataloader(r: Rank) -> None:
    hang = r.fault == "loader" and r.rank == r.fault_rank
    loader = torch.utils.data.DataLoader(_Slow(hang, r.out / f"fault-{r.rank}"), batch_size=4, num_workers=1,
                                         prefetch_factor=1)
    for step, batch in enumerate(iter(loader)):
        if step >= STEPS:
            break
        r.at_step(step)
        dist.all_reduce(batch.sum(0))


PROGRAMS: dict[str, Callable[[Rank], None]] = {
    "ddp": ddp, "fsdp2": fsdp2, "tensor_parallel": tensor_parallel, "mesh3d": mesh3d, "dcp_save": dcp_save,
    "objects": objects, "scatter_gather": scatter_gather, "monitored_barrier": monitored, "pipeline": pipeline,
    "dataloader": dataloader,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("program", "fault", "out"):
        parser.add_argument(f"--{name}", required=True)
    for name in ("rank", "world", "port"):
        parser.add_argument(f"--{name}", type=int, required=True)
    args = parser.parse_args()
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    r = Rank(args)
    threading.Thread(target=r.watch, daemon=True).start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=120))
    try:
        PROGRAMS[args.program](r)
    except Exception:
        r.dump("on_exception")  # the survivors of a crash: their recorders as their collectives failed
        raise
    # The program's last collective was waited for; let gloo retire it, as a job that runs on would.
    time.sleep(0.5)
    r.dump("end")
    (r.out / f"finished-{r.rank}").write_text("")
    # Peers may still be dumping: leave without a teardown collective (the launcher ends the job).
    while not (r.out / "release").exists():
        time.sleep(0.05)
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
