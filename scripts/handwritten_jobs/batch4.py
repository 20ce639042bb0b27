"""The fourth batch of hand-written scenarios (one rank each; job.py runs them by name): libraries and shapes the
first three batches did not have (FSDP1, ZeroRedundancyOptimizer, Schedule1F1B, DDP static graph and Join,
Megatron-style autograd collectives, list-form collectives, collectives from a sampler and from a second
thread, DCP async_save, a rank that destroys its group early, replicas that end apart, a 3-D layout of
locally synchronized groups, deaths without a dump). Each injects one fault, or none; the truth the
controller writes says which."""

import os
import random
import signal
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from rankio import OUT, RANK, WS, hang_here, progress
from torch import nn


def _mine(layout):
    groups = [dist.new_group(ranks) for ranks in layout]
    return next(g for g, ranks in zip(groups, layout, strict=True) if RANK in ranks)


class _Gate(nn.Module):
    # a layer whose forward blocks on one rank at one step (a data-dependent branch that never returns)
    def __init__(self, inner, rank, step):
        super().__init__()
        self.inner, self.rank, self.step, self.calls = inner, rank, step, 0

    def forward(self, x):
        if RANK == self.rank and self.calls == self.step:
            hang_here()
        self.calls += 1
        return self.inner(x)


def scen_fsdp1_fwd_hang():
    # FSDP1 (FullyShardedDataParallel, one unit per Linear); rank 2 blocks in the second layer's forward at
    # step 3, after the first unit's all_gather
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), _Gate(nn.Linear(32, 32), 2, 3), nn.ReLU(), nn.Linear(32, 4))
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), use_orig_params=True,
                device_id=torch.device("cpu"))
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.01)
    for step in range(10):
        progress(step)
        fsdp(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def scen_zero_step_hang():
    # DDP with ZeroRedundancyOptimizer (each rank owns a shard of the optimizer state and broadcasts its
    # parameters after its step); rank 1 blocks in its gradient clipping's logging before opt.step() at step 3
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.01)
    for step in range(10):
        progress(step)
        ddp(torch.randn(8, 16)).sum().backward()
        if RANK == 1 and step == 3:
            hang_here()
        opt.step()
        opt.zero_grad()


def scen_a2a_list_hang():
    # expert parallel with the list form of all_to_all (one tensor per peer), then the loss all_reduce; rank 3
    # blocks in its router before the step-4 exchange
    for step in range(12):
        progress(step)
        if RANK == 3 and step == 4:
            hang_here()
        inp = [torch.full((3,), float(RANK)) for _ in range(WS)]
        out = [torch.empty(3) for _ in range(WS)]
        dist.all_to_all(out, inp)
        dist.all_reduce(torch.ones(2))


def scen_rs_list_hang():
    # tensor-parallel pairs and strided data-parallel triples: activations summed over the pair, gradients
    # reduce_scattered (list form) and parameters all_gathered (list form) over the triple; rank 3 blocks
    # between its reduce_scatter and its all_gather at step 4
    tp = _mine([[0, 1], [2, 3], [4, 5]])
    dp = _mine([[0, 2, 4], [1, 3, 5]])
    t = torch.ones(6)
    for step in range(12):
        progress(step)
        dist.all_reduce(t, group=tp)
        shard = torch.empty(2)
        dist.reduce_scatter(shard, [torch.ones(2) for _ in range(3)], group=dp)
        if RANK == 3 and step == 4:
            hang_here()
        parts = [torch.empty(2) for _ in range(3)]
        dist.all_gather(parts, shard, group=dp)
        t = torch.cat(parts) / 6


def scen_ag_list_size():
    # per-rank statistics all_gathered (list form) over the world; at step 3 rank 2's padded batch gives it 10
    # values instead of 8 (its output list sized the same way)
    for step in range(12):
        progress(step)
        dist.all_reduce(torch.ones(4))
        n = 10 if (RANK == 2 and step == 3) else 8
        out = [torch.empty(n) for _ in range(WS)]
        dist.all_gather(out, torch.ones(n))


def scen_gather_root_abort():
    # metrics gathered to rank 2 every step; rank 2's custom C++ op asserts (abort: no Python error path, no
    # dump) at step 4 before the gather
    t = torch.ones(4)
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        t = t / 5
        if RANK == 2 and step == 4:
            os.abort()
        dist.gather(t, [torch.empty(4) for _ in range(WS)] if RANK == 2 else None, dst=2)


def scen_thread_groups_hang():
    # gradients on the default group from the main thread; metrics on a second group of the same ranks from a
    # metrics thread joined at the end of each step; rank 1's metrics thread blocks computing a metric at
    # step 3 (its main thread then waits in join)
    mg = dist.new_group()
    t = torch.ones(8)

    def metrics(step):
        if RANK == 1 and step == 3:
            hang_here()
        dist.all_reduce(torch.full((2,), float(step)), group=mg)

    for step in range(12):
        progress(step)
        th = threading.Thread(target=metrics, args=(step,), name="metrics")
        th.start()
        dist.all_reduce(t)
        t = t / WS
        th.join()


def scen_destroy_early():
    # rank 3's local early-stopping check fires at step 5: it destroys its process group and goes on to a long
    # local evaluation, while the others all_reduce step 5
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        if RANK == 3 and step == 5:
            dist.destroy_process_group()
            hang_here()  # the final evaluation, on this rank alone
        dist.all_reduce(t)
        t = t / WS


def scen_ddp_static_hook_hang():
    # DDP with static_graph and gradient_as_bucket_view, small buckets; a gradient hook on the first layer's
    # weight (clipping statistics) blocks on rank 2 in the backward of step 4
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    state = {"step": 0}

    def hook(g):
        if RANK == 2 and state["step"] == 4:
            hang_here()
        return g

    model[0].weight.register_hook(hook)
    ddp = nn.parallel.DistributedDataParallel(model, static_graph=True, gradient_as_bucket_view=True,
                                              bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(10):
        state["step"] = step
        progress(step)
        ddp(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def scen_pp_1f1b_hang():
    # a 4-stage Schedule1F1B pipeline (4 micro-batches), the loss all_reduced over the world after each step;
    # stage 2's forward blocks on its second micro-batch of step 3
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.manual_seed(0)
    mod = _Gate(nn.Linear(16, 16), 2, 3 * 4 + 1)
    stage = PipelineStage(mod, RANK, WS, torch.device("cpu"))
    sched = Schedule1F1B(stage, n_microbatches=4, loss_fn=lambda out, _t: out.sum())
    for step in range(10):
        progress(step)
        x = torch.randn(8, 16)
        if RANK == 0:
            sched.step(x)
        elif RANK == WS - 1:
            sched.step(target=x)
        else:
            sched.step()
        dist.all_reduce(torch.ones(1))


class _SyncedSampler(torch.utils.data.Sampler):
    # a sampler that agrees on each epoch's shuffle seed by broadcasting rank 0's at the epoch's start
    def __init__(self, n):
        self.n, self.epoch = n, 0

    def __iter__(self):
        seed = torch.tensor([random.randrange(1 << 30) if RANK == 0 else 0])
        dist.broadcast(seed, src=0)
        g = torch.Generator().manual_seed(int(seed) + self.epoch)
        idx = torch.randperm(self.n, generator=g)[RANK::WS].tolist()
        return iter(idx)

    def __len__(self):
        return self.n // WS


def save_epoch_stats():
    hang_here()


def scen_sampler_bcast_hang():
    # a DataLoader whose sampler broadcasts the epoch's seed (inside the loader's iter); rank 1 blocks saving
    # its epoch statistics at the end of epoch 1, the others wait in the next epoch's sampler broadcast
    data = torch.utils.data.TensorDataset(torch.randn(64, 4))
    sampler = _SyncedSampler(64)
    dl = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    step = 0
    for epoch in range(6):
        sampler.epoch = epoch
        for (batch,) in dl:
            progress(step)
            step += 1
            dist.all_reduce(batch)
        if RANK == 1 and epoch == 1:
            save_epoch_stats()


def scen_grid_sub_straggler():
    # tensor-parallel groups of 4 (two nodes) and data-parallel pairs across them; rank 5 computes slowly
    # before its tensor-parallel all_reduce at every step (a throttled core): its node's peers wait there, and
    # the whole second node arrives late at every data-parallel pair
    tp = _mine([[0, 1, 2, 3], [4, 5, 6, 7]])
    dp = _mine([[0, 4], [1, 5], [2, 6], [3, 7]])
    t = torch.ones(32)
    for step in range(45):
        progress(step)
        time.sleep(0.02 + (0.15 if RANK == 5 else 0.0))
        dist.all_reduce(t, group=tp)
        dist.all_reduce(t, group=dp)
        t = t / 8


def scen_healthy_variable_steps():
    # a long warmup (rank 0 builds the dataset index and broadcasts it), then steps whose length follows the
    # batch's sequence length (the same on every rank: a shared seed) with a little per-rank jitter
    shared, own = random.Random(7), random.Random(RANK)
    idx = torch.zeros(16)
    if RANK == 0:
        time.sleep(1.5)
    dist.broadcast(idx, src=0)
    t = torch.ones(32)
    for step in range(30):
        progress(step)
        time.sleep(shared.choice([0.01, 0.02, 0.05, 0.12]) + own.uniform(0.0, 0.01))
        dist.all_reduce(t)
        t = t / WS


def scen_healthy_rank0_eval():
    # every 3rd step rank 0 alone evaluates (the others wait for its result in a broadcast)
    t = torch.ones(16)
    for step in range(24):
        progress(step)
        time.sleep(0.02)
        dist.all_reduce(t)
        t = t / WS
        if step % 3 == 2:
            res = torch.zeros(2)
            if RANK == 0:
                time.sleep(0.3)
                res += step
            dist.broadcast(res, src=0)


def scen_local_sync_3d_hang():
    # 12 ranks as pp=3 x dp=2 x tp=2 (rank = 4*pp + 2*dp + tp); each rank creates only its own three groups,
    # with use_local_synchronization, in the one global order (tp, dp, pp: torch warns that overlapping groups
    # created locally in different orders deadlock); rank 7 blocks between its dp and its pp all_reduce at
    # step 3
    pp, dp, tp = RANK // 4, (RANK // 2) % 2, RANK % 2
    ranks = {
        "tp": [4 * pp + 2 * dp + i for i in range(2)],
        "dp": [4 * pp + 2 * i + tp for i in range(2)],
        "pp": [4 * i + 2 * dp + tp for i in range(3)],
    }
    g = {k: dist.new_group(ranks[k], use_local_synchronization=True) for k in ("tp", "dp", "pp")}
    t = torch.ones(8)
    for step in range(10):
        progress(step)
        dist.all_reduce(t, group=g["tp"])
        dist.all_reduce(t, group=g["dp"])
        if RANK == 7 and step == 3:
            hang_here()
        dist.all_reduce(t, group=g["pp"])
        t = t / 12


def scen_exit0_no_dump():
    # rank 2 runs out of data after step 4: it leaves the loop, destroys its process group and exits with code
    # 0, writing no dump; the others all_reduce step 5
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        if RANK == 2 and step == 5:
            dist.destroy_process_group()
            os._exit(0)
        dist.all_reduce(t)
        t = t / WS


def scen_sigkill_in_agit():
    # parameters all_gather_into_tensor'ed every step; at step 4 rank 0 is late (a slow data load) and rank 3 is
    # SIGKILLed (the OOM killer) while it waits inside the all_gather
    t = torch.ones(4)
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        t = t / WS
        if step == 4 and RANK == 0:
            time.sleep(1.0)
        if step == 4 and RANK == 3:
            threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGKILL)).start()
        dist.all_gather_into_tensor(torch.empty(4 * WS), t)


def scen_master_killed():
    # tensor-parallel pairs and the world; rank 0 (which also hosts the rendezvous store) is SIGKILLed after its
    # pair's all_reduce at step 4: no dump
    tp = _mine([[0, 1], [2, 3], [4, 5]])
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        dist.all_reduce(t, group=tp)
        if RANK == 0 and step == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)
        t = t / 12


class _CopyToTP(torch.autograd.Function):
    # Megatron's f: identity forward, all_reduce of the gradient over the tensor-parallel group in backward
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    # Megatron's g: all_reduce forward, identity backward
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def compute_loss(y, step):
    if RANK == 1 and step == 3:
        hang_here()  # a label lookup that never returns
    return y.sum()


def scen_tp_autograd_hang():
    # tensor-parallel pairs [0, 1], [2, 3] with Megatron-style column/row-parallel layers (collectives inside
    # autograd functions), gradients all_reduced over data-parallel pairs [0, 2], [1, 3]; rank 1 blocks in its
    # loss at step 3, after the forward's all_reduce, before the backward's
    tp = _mine([[0, 1], [2, 3]])
    dp = _mine([[0, 2], [1, 3]])
    torch.manual_seed(RANK % 2)
    col, row = nn.Linear(16, 8), nn.Linear(8, 16)
    for step in range(10):
        progress(step)
        x = _CopyToTP.apply(torch.randn(4, 16, requires_grad=True), tp)
        y = _ReduceFromTP.apply(row(torch.relu(col(x))), tp)
        compute_loss(y, step).backward()
        for p in (*col.parameters(), *row.parameters()):
            dist.all_reduce(p.grad, group=dp)
            p.grad = None


def scen_healthy_ddp_join():
    # DDP over uneven inputs under the Join context manager (rank r has 6 + 2r batches): the ranks that run out
    # shadow the others' all_reduces until all have joined
    from torch.distributed.algorithms.join import Join

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    with Join([ddp]):
        for step in range(6 + 2 * RANK):
            progress(step)
            ddp(torch.randn(8, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.02)


def scen_replica_exit_hang():
    # two independent replicas of 3 ranks (an ensemble); replica [3, 4, 5] finishes its 8 steps, destroys its
    # process group and exits (code 0, no dump); rank 1 blocks at step 4 and its replica waits for it
    sub, _ = dist.new_subgroups_by_enumeration([[0, 1, 2], [3, 4, 5]])
    t = torch.ones(8)
    for step in range(8):
        progress(step)
        time.sleep(0.05)
        if RANK == 1 and step == 4:
            hang_here()
        dist.all_reduce(t, group=sub)
        dist.broadcast(t, src=0 if RANK < 3 else 3, group=sub)
        t = t / 3
    dist.destroy_process_group()
    os._exit(0)


def scen_healthy_two_world_groups():
    # the default group for gradients (async, waited late) and a second group of the same ranks for metrics,
    # used alternately, with per-rank jitter
    mg = dist.new_group()
    rng = random.Random(RANK)
    g = torch.ones(32)
    for step in range(30):
        progress(step)
        w = dist.all_reduce(g, async_op=True)
        time.sleep(rng.uniform(0.0, 0.02))
        m = torch.full((2,), float(step))
        dist.all_reduce(m, group=mg)
        w.wait()
        if step % 5 == 4:
            dist.barrier(group=mg)
        g = g / WS


def scen_dcp_async_hang():
    # DCP async_save every 3 steps on a group of its own (planning and writing in torch's background thread),
    # training all_reduces in the main thread, each save waited before the next; rank 2's storage write blocks
    # at the step-3 save
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    class Writer(FileSystemWriter):
        def write_data(self, plan, planner):
            if RANK == 2 and self.stuck:
                hang_here()
            return super().write_data(plan, planner)

    root = os.path.join(tempfile.gettempdir(), f"dcp-async-{os.path.basename(OUT)}")
    ckpt_pg = dist.new_group()  # async_save's collectives run in its own thread: a group of their own
    t = torch.ones(8)
    fut = None
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        t = t / WS
        if step % 3 == 0:
            if fut is not None:
                fut.result()
            w = Writer(os.path.join(root, f"step{step}"))
            w.stuck = step == 3
            fut = dcp.async_save({"w": t * RANK, "step": torch.tensor(step)}, storage_writer=w, process_group=ckpt_pg)
    if fut is not None:
        fut.result()

