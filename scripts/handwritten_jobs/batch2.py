"""The second batch of hand-written scenarios (one rank each; job.py runs them by name): shapes the first batch
did not have. Each injects one fault, or none; the truth the controller writes says which."""

import os
import signal
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from rankio import OUT, RANK, WS, hang_here, progress, write_dumps


def _grid(tp):
    tps = [dist.new_group(list(range(i, i + tp))) for i in range(0, WS, tp)]
    dps = [dist.new_group(list(range(j, WS, tp))) for j in range(tp)]
    return tps[RANK // tp], dps[RANK % tp]


def scen_rs_size():
    # ZeRO-style gradient reduce_scatter then parameter all_gather; at step 3 one rank's flat buffer is
    # padded differently (a larger shard on that rank only)
    for step in range(12):
        progress(step)
        shard = 5 if (RANK == 4 and step == 3) else 4
        out = torch.empty(shard)
        dist.reduce_scatter_tensor(out, torch.ones(WS * shard))
        full = torch.empty(WS * shard)
        dist.all_gather_into_tensor(full, out)


def scen_ag_size():
    # the all_gather_into_tensor of a parameter shard is the one that goes wrong
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        shard = 6 if (RANK == 1 and step == 4) else 4
        full = torch.empty(WS * shard)
        dist.all_gather_into_tensor(full, torch.ones(shard))


def read_config():
    hang_here()


def scen_bcast_root_hang():
    # the config is broadcast from rank 3 (not 0) each step; rank 3 hangs reading it
    t = torch.ones(8)
    cfg = torch.zeros(4)
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        if RANK == 3 and step == 4:
            read_config()
        dist.broadcast(cfg, src=3)


def scen_subgroups_hang():
    # new_subgroups of 3 (torch describes them `undefined`); rank 4 hangs before its subgroup's all_reduce
    sub, _ = dist.new_subgroups(group_size=3)
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        if RANK == 4 and step == 3:
            hang_here()
        dist.all_reduce(t, group=sub)
        t = t / 9


def scen_a2a_splits():
    # MoE token routing: the splits change every step (the same on every rank); at step 4 rank 1 routes
    # one more token to each peer than the peers expect
    for step in range(12):
        progress(step)
        k = 1 + step % 3
        mine = k + 1 if (RANK == 1 and step == 4) else k
        inp = torch.ones(mine * WS)
        out = torch.empty(k * WS)
        dist.all_to_all_single(out, inp, output_split_sizes=[k] * WS, input_split_sizes=[mine] * WS)
        dist.all_reduce(out)


def scen_gather_nonroot_hang():
    # metrics gathered on rank 0 every step; rank 3 (not the root) hangs
    t = torch.ones(4)
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        if RANK == 3 and step == 4:
            hang_here()
        dist.gather(t, [torch.empty(4) for _ in range(WS)] if RANK == 0 else None, dst=0)


def build_shards():
    hang_here()


def scen_scatter_root_hang():
    # the root (rank 2) scatters shards every step and hangs building them
    t = torch.ones(4)
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        if RANK == 2 and step == 4:
            build_shards()
        dist.scatter(t, [torch.ones(4) for _ in range(WS)] if RANK == 2 else None, src=2)


def scen_early_exit():
    # tensor-parallel pairs and a world all_reduce; rank 5 runs out of data after step 4's pair
    # all_reduce, writes its end-of-run dump and exits cleanly while the others wait
    tpg, _ = _grid(2)
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        dist.all_reduce(t, group=tpg)
        if RANK == 5 and step == 4:
            write_dumps()
            sys.exit(0)
        dist.all_reduce(t)
        t = t / 12


def scen_sigkill_async():
    # async all_reduce over tensor-parallel groups of 4, waited after the data-parallel one; rank 6 is
    # SIGKILLed (the OOM killer) right after issuing its async op at step 3: no dump
    tpg, dpg = _grid(4)
    a, b = torch.ones(8), torch.ones(8)
    for step in range(12):
        progress(step)
        w = dist.all_reduce(a, group=tpg, async_op=True)
        if RANK == 6 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(b, group=dpg)
        w.wait()


def scen_stale_other():
    # rank 4 hangs at step 6; rank 1 is healthy throughout, but the only dump of it is one its periodic
    # dump thread wrote from step 2 on (the later ones were not collected)
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        if RANK == 1 and step == 2:
            threading.Thread(target=write_dumps, kwargs={"freeze": True}).start()
        if RANK == 4 and step == 6:
            hang_here()
        dist.all_reduce(t)
        dist.broadcast(t, src=0)


def scen_async_unwaited():
    # a grad-norm all_reduce launched async and never waited; at step 5 rank 2 hangs after launching it,
    # before the step's loss all_reduce
    g, loss = torch.ones(16), torch.ones(1)
    for step in range(12):
        progress(step)
        dist.all_reduce(g, async_op=True)
        if RANK == 2 and step == 5:
            hang_here()
        dist.all_reduce(loss)


def scen_straggler_one_of_6():
    # pairs and the world; rank 3 is slow at every step (a throttled CPU)
    tpg, _ = _grid(2)
    t = torch.ones(32)
    for step in range(50):
        progress(step)
        time.sleep(0.03 + (0.15 if RANK == 3 else 0.0))
        dist.all_reduce(t, group=tpg)
        dist.all_reduce(t)
        t = t / 12


def scen_p2p_wrong_peer():
    # a ring exchange (send to the next, receive from the previous) then a world all_reduce; at step 3
    # rank 1 sends to rank 3 instead of rank 2
    x = torch.ones(8)
    for step in range(12):
        progress(step)
        nxt, prv = (RANK + 1) % WS, (RANK - 1) % WS
        dst = 3 if (RANK == 1 and step == 3) else nxt
        if RANK % 2 == 0:
            dist.send(x, dst=dst)
            dist.recv(x, src=prv)
        else:
            dist.recv(x, src=prv)
            dist.send(x, dst=dst)
        dist.all_reduce(x)
        x = x / WS


def scen_strided12_hang():
    # 12 ranks: tensor-parallel groups of 4 in a row, data-parallel groups strided by 4; rank 9 hangs
    # between its tensor-parallel and data-parallel all_reduce
    tpg, dpg = _grid(4)
    t = torch.ones(8)
    for step in range(10):
        progress(step)
        dist.all_reduce(t, group=tpg)
        if RANK == 9 and step == 3:
            hang_here()
        dist.all_reduce(t, group=dpg)
        t = t / 12


def scen_dtensor_hang():
    # a 2x2 mesh: a row-sharded activation gathered over `tp` by redistribute, gradients summed over `dp`
    # from Partial; rank 1 hangs before the step-3 redistribute
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for step in range(10):
        progress(step)
        act = DTensor.from_local(torch.ones(2, 4), mesh, [Replicate(), Shard(0)])
        if RANK == 1 and step == 3:
            hang_here()
        full = act.redistribute(mesh, [Replicate(), Replicate()])
        grad = DTensor.from_local(full.to_local().sum(0), mesh, [Partial(), Replicate()])
        grad.redistribute(mesh, [Replicate(), Replicate()]).to_local()


def scen_dcp_save_stuck():
    # DCP save every 2 steps; at step 4 rank 2's storage write never returns (a hung file system)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    class Writer(FileSystemWriter):
        def write_data(self, plan, planner):
            if RANK == 2 and self.stuck:
                hang_here()
            return super().write_data(plan, planner)

    root = os.path.join(tempfile.gettempdir(), f"dcp-{os.path.basename(OUT)}")
    t = torch.ones(8)
    for step in range(10):
        progress(step)
        dist.all_reduce(t)
        if step % 2 == 0:
            w = Writer(os.path.join(root, f"step{step}"))
            w.stuck = step == 4
            dcp.save({"w": t * RANK, "step": torch.tensor(step)}, storage_writer=w)


def scen_healthy_eval():
    # training all_reduce every step; every 4th step an eval: metrics all_gathered, loss reduced to 0, the
    # early-stop flag broadcast from 0, a barrier
    t = torch.ones(16)
    for step in range(24):
        progress(step)
        dist.all_reduce(t)
        t = t / WS
        if step % 4 == 3:
            m = torch.empty(2 * WS)
            dist.all_gather_into_tensor(m, torch.ones(2))
            dist.reduce(torch.ones(1), dst=0)
            flag = torch.zeros(1)
            dist.broadcast(flag, src=0)
            dist.barrier()


def scen_healthy_objects():
    # object collectives with moving roots: a stats dict all-gathered, a config broadcast from a root that
    # moves, gathered to rank 1, scattered from rank 0
    t = torch.ones(4)
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        out = [None] * WS
        dist.all_gather_object(out, {"rank": RANK, "step": step})
        cfg = [{"lr": 0.1 * step}] if RANK == step % WS else [None]
        dist.broadcast_object_list(cfg, src=step % WS)
        if step % 3 == 0:
            dist.gather_object({"r": RANK}, [None] * WS if RANK == 1 else None, dst=1)
            got = [None]
            dist.scatter_object_list(got, [{"i": i} for i in range(WS)] if RANK == 0 else None, src=0)


class _Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x, step):
        return self.head((self.a if step % 2 else self.b)(x))


def scen_healthy_ddp_unused():
    # DDP with find_unused_parameters: half the model is unused every other step
    ddp = torch.nn.parallel.DistributedDataParallel(_Branchy(), find_unused_parameters=True)
    for step in range(16):
        progress(step)
        ddp(torch.randn(8, 16), step).sum().backward()

