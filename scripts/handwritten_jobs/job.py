"""One rank of a hand-written job (scenario: argv[1]): torch's pickle, JSON dump and faulthandler stacks are
written into JOB_OUT when the controller creates JOB_OUT/trigger, and on the rank's error path."""

import datetime
import os
import random
import sys
import time

import batch2
import batch3
import batch4
import batch5
import torch
import torch.distributed as dist
from rankio import OUT, RANK, WS, hang_here, progress, start_watcher, write_dumps

SCEN = sys.argv[1]
start_watcher()


def load_shard():
    hang_here()


def scen_pp_stage_hang():
    # 4-stage pipeline, 2 microbatches, then loss all_reduce over the world
    x = torch.ones(16)
    for step in range(20):
        progress(step)
        for mb in range(2):
            if RANK > 0:
                dist.recv(x, src=RANK - 1)
            if RANK == 2 and step == 3 and mb == 1:
                load_shard()
            x = x * 1.0
            if RANK < WS - 1:
                dist.send(x, dst=RANK + 1)
        loss = torch.tensor([float(step)])
        dist.all_reduce(loss)


def grid(tp):
    tps = [dist.new_group(list(range(i, i + tp))) for i in range(0, WS, tp)]
    dps = [dist.new_group(list(range(j, WS, tp))) for j in range(tp)]
    return tps[RANK // tp], dps[RANK % tp]


def scen_grid_crash():
    tpg, dpg = grid(2)
    t = torch.ones(32)
    for step in range(30):
        progress(step)
        dist.all_reduce(t, group=tpg)
        if RANK == 5 and step == 4:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        dist.all_reduce(t, group=dpg)
        t = t / 2


def scen_moe_a2a_hang():
    for step in range(30):
        progress(step)
        if RANK == 3 and step == 3:
            hang_here()
        inp = torch.arange(8, dtype=torch.float32) + RANK
        out = torch.empty(8)
        dist.all_to_all_single(out, inp)
        dist.all_reduce(out)


def scen_slow_node():
    t = torch.ones(64)
    for step in range(60):
        progress(step)
        time.sleep(0.05)
        if RANK in (6, 7):
            time.sleep(0.25)
        dist.all_reduce(t)
        t = t / 8


def scen_object_hang_rank0():
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        dist.all_reduce(t)
        if RANK == 0 and step == 4:
            hang_here()
        out = [None] * WS
        dist.all_gather_object(out, {"loss": float(step), "rank": RANK})


def scen_healthy_uneven():
    groups, _ = dist.new_subgroups_by_enumeration([[0, 1, 2], [3, 4]])
    t = torch.ones(16)
    for step in range(400):
        progress(step)
        dist.all_reduce(t, group=groups)
        dist.all_reduce(t)
        t = t / 10
        time.sleep(0.02)


def scen_healthy_pipeline():
    x = torch.ones(16)
    for step in range(400):
        progress(step)
        for _microbatch in range(2):
            if RANK > 0:
                dist.recv(x, src=RANK - 1)
            time.sleep(0.005)
            if RANK < WS - 1:
                dist.send(x, dst=RANK + 1)
        dist.all_reduce(torch.ones(1))


def scen_nested_hang():
    tpg, dpg = grid(2)
    t = torch.ones(32)
    for step in range(30):
        progress(step)
        dist.all_reduce(t, group=tpg)
        if RANK == 4 and step == 3:
            hang_here()
        dist.all_reduce(t, group=tpg)
        dist.all_reduce(t, group=dpg)
        t = t / 4


def scen_crash_with_dump():
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        if RANK == 1 and step == 3:
            write_dumps()
            os._exit(1)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)


def scen_ckpt_barrier_hang():
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        dist.all_reduce(t)
        if step == 3:
            if RANK == 0:
                hang_here()  # saving checkpoint
            dist.barrier()


def scen_rs_dtype():
    for step in range(30):
        progress(step)
        dt = torch.float64 if (RANK == 1 and step == 3) else torch.float32
        inp = torch.ones(WS * 4, dtype=dt)
        out = torch.empty(4, dtype=dt)
        dist.reduce_scatter_tensor(out, inp)
        g = torch.empty(WS * 4, dtype=dt)
        dist.all_gather_into_tensor(g, out)


def scen_two_hangs():
    tpg, dpg = grid(4)
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        if step == 3 and RANK in (1, 6):
            hang_here()
        dist.all_reduce(t, group=tpg)
        dist.all_reduce(t, group=dpg)


def scen_async_bucket_hang():
    ts = [torch.ones(100) for _ in range(4)]
    for step in range(30):
        progress(step)
        works = []
        for i, b in enumerate(ts):
            if RANK == 2 and step == 5 and i == 2:
                hang_here()
            works.append(dist.all_reduce(b, async_op=True))
        for w in works:
            w.wait()


def scen_healthy_slow_steps():
    t = torch.ones(1024)
    for step in range(60):
        progress(step)
        time.sleep(0.1 + random.uniform(0, 0.1))
        dist.all_reduce(t)
        dist.all_gather_into_tensor(torch.empty(1024 * WS), t)


def scen_ddp_forward_hang():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(30):
        progress(step)
        x = torch.randn(16, 32)
        if RANK == 1 and step == 4:
            hang_here()
        loss = ddp(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


def scen_ddp_crash():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    for step in range(30):
        progress(step)
        if RANK == 2 and step == 5:
            os._exit(1)  # killed: no dump
        ddp(torch.randn(16, 32)).sum().backward()


def scen_fsdp_hang():
    from torch.distributed.fsdp import fully_shard

    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(3)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    for step in range(30):
        progress(step)
        if RANK == 3 and step == 3:
            hang_here()
        model(torch.randn(4, 32)).sum().backward()


def scen_healthy_ddp():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    for step in range(40):
        progress(step)
        ddp(torch.randn(16, 32)).sum().backward()


def scen_uneven_data():
    # rank 2 has fewer batches: leaves the loop and waits in the final barrier; the others all_reduce
    t = torch.ones(8)
    n = 5 if RANK == 2 else 8
    for step in range(n):
        progress(step)
        dist.all_reduce(t)
    dist.barrier()


class HangingDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if RANK == 0 and i >= 16 * 3:
            time.sleep(3600)
        return torch.ones(4)


def scen_loader_hang():
    dl = torch.utils.data.DataLoader(HangingDataset(), batch_size=16, num_workers=1)
    for step, batch in enumerate(dl):
        progress(step)
        dist.all_reduce(batch)
        if step > 30:
            break


def scen_two_rank_straggler():
    t = torch.ones(64)
    for step in range(60):
        progress(step)
        time.sleep(0.05)
        if RANK == 1:
            time.sleep(0.12)
        dist.all_reduce(t)


def scen_subgroup_size_mismatch():
    groups, _ = dist.new_subgroups(group_size=2)
    for step in range(30):
        progress(step)
        n = 12 if (RANK == 3 and step == 4) else 8
        t = torch.ones(n)
        out = [torch.empty(n) for _ in range(2)]
        dist.all_gather(out, t, group=groups)
        dist.all_reduce(torch.ones(4))


def scen_mesh3d_crash():
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    tp, dp = mesh["tp"].get_group(), mesh["dp"].get_group()
    t = torch.ones(16)
    for step in range(30):
        progress(step)
        dist.all_reduce(t, group=tp)
        if RANK == 6 and step == 3:
            os._exit(1)
        dist.all_reduce(t, group=dp)
        t = t / 4


def scen_hang_timeout_dumps():
    # short timeout: the waiting ranks fail and dump on their error path; the stuck rank never dumps
    t = torch.ones(8)
    g = dist.new_group(timeout=datetime.timedelta(seconds=4))
    for step in range(30):
        progress(step)
        if RANK == 2 and step == 3:
            hang_here()
        dist.all_reduce(t, group=g)


def scen_object_bcast_hang():
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        dist.all_reduce(t)
        obj = [{"step": step}] if RANK == 0 else [None]
        if RANK == 3 and step == 5:
            hang_here()
        dist.broadcast_object_list(obj, src=0)


def scen_hang_ws2():
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        if RANK == 0 and step == 6:
            hang_here()
        dist.all_reduce(t)


def scen_order_inversion():
    tpg, dpg = grid(2)
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        if RANK == 1 and step == 3:
            dist.all_reduce(t, group=dpg)
            dist.all_reduce(t, group=tpg)
        else:
            dist.all_reduce(t, group=tpg)
            dist.all_reduce(t, group=dpg)


def scen_op_mismatch():
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        if RANK == 2 and step == 4:
            out = [torch.empty(8) for _ in range(WS)]
            dist.all_gather(out, t)
        else:
            dist.all_reduce(t)


def scen_dtype_mismatch():
    for step in range(30):
        progress(step)
        t = torch.ones(8, dtype=torch.float64 if (RANK == 3 and step == 4) else torch.float32)
        dist.all_reduce(t)


def scen_tp_skip():
    tpg, dpg = grid(2)
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        if not (RANK == 5 and step == 4):
            dist.all_reduce(t, group=tpg)
        dist.all_reduce(t, group=dpg)


def scen_rank0_exception():
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        dist.all_reduce(t)
        if RANK == 0 and step == 5:
            raise ValueError("loss is NaN")
        dist.broadcast(t, src=0)


def scen_big_hang():
    tpg, dpg = grid(4)
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        dist.all_reduce(t, group=tpg)
        if RANK == 13 and step == 3:
            hang_here()
        dist.all_reduce(t, group=dpg)
        dist.all_reduce(t)


def scen_healthy_async():
    ts = [torch.ones(50) for _ in range(3)]
    for step in range(50):
        progress(step)
        works = [dist.all_reduce(b, async_op=True) for b in ts]
        for w in works:
            w.wait()
        time.sleep(0.01)
    dist.barrier()


def scen_straggler_jitter():
    t = torch.ones(64)
    for step in range(60):
        progress(step)
        time.sleep(random.uniform(0.0, 0.04) + (0.15 if RANK == 2 else 0.0))
        dist.all_reduce(t)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    try:
        scen = globals().get("scen_" + SCEN)
        for batch in (batch2, batch3, batch4, batch5):
            scen = scen or getattr(batch, "scen_" + SCEN, None)
        scen()
    except Exception:
        write_dumps(freeze=True)  # error-path dump, as jobs do: the rank's last (it exits now)
        raise
    progress("end")
    while not os.path.exists(f"{OUT}/done_{RANK}"):
        time.sleep(0.05)
    dist.destroy_process_group()


main()
