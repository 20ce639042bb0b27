"""The fifth batch of hand-written scenarios (one rank each; job.py runs them by name): torch's libraries and
launchers used in ways the earlier batches and the library sweep do not: FSDP2 on a 2-D mesh (HSDP) and with
tensor parallel, functional collectives (eager and compiled), DCP async_save and load, interleaved pipeline
schedules, gradient clipping under FSDP2, a DataLoader with persistent workers, monitored_barrier without
wait_all_ranks, and jobs run by torchrun (its @record, two agents on one host). Each injects one fault, or
none; the truth the controller writes says which."""

import datetime
import os
import random
import time

import torch
import torch.distributed as dist
from rankio import OUT, RANK, WS, hang_here, progress
from torch import nn


class _Net(nn.Module):
    # three linears; `stall` makes the backward pass hang on this rank between the last layer's gradient and
    # the middle one's (a tensor hook on the middle activation, as a gradient-logging hook would be)
    def __init__(self, width=16):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width), nn.Linear(width, 4)
        self.stall = False

    def forward(self, x):
        h = torch.relu(self.l2(torch.relu(self.l1(x))))
        if self.stall:
            h.register_hook(lambda g: hang_here())
        return self.l3(h)


def _shard_layers(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for layer in (model.l1, model.l2, model.l3):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def scen_hsdp_backward_hang():
    # HSDP: fully_shard over a (replicate, shard) mesh of 2 x WS/2; rank 2's backward hangs in a gradient hook
    # at step 3, after its last layer's reduce-scatter and all_reduce
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, WS // 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = _Net()
    _shard_layers(model, mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10):
        progress(step)
        model.stall = RANK == 2 and step == 3
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def _fsdp_tp(stuck_rank, steps):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (WS // 2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    from torch.distributed.fsdp import fully_shard

    for i in (0, 2, 4):
        fully_shard(model[i], mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = random.Random(RANK)
    for step in range(steps):
        progress(step)
        torch.manual_seed(100 + step + 1000 * mesh["dp"].get_local_rank())  # one batch per tp group
        x = torch.randn(8, 16)
        if RANK == stuck_rank and step == 3:
            hang_here()
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(rng.uniform(0.0, 0.02))


def scen_fsdp_tp_hang():
    # FSDP2 over dp and tensor parallel (colwise/rowwise) over tp on a (WS/2, 2) mesh; rank 1 hangs loading its
    # batch at step 3
    _fsdp_tp(1, 10)


def scen_healthy_fsdp_tp():
    _fsdp_tp(-1, 12)


def _funcol_step(x, group):
    import torch.distributed._functional_collectives as funcol

    y = funcol.all_reduce(x, "sum", group)
    z = funcol.all_gather_tensor(y, 0, group)
    return z.view(-1, x.numel()).sum(0) * 2


def scen_funcol_hang():
    # functional collectives (eager: all_reduce, all_gather_tensor) on the world, then a reduce_scatter_tensor
    # of gradients; rank 3 hangs between its all_reduce and its all_gather_tensor at step 4
    import torch.distributed._functional_collectives as funcol

    x = torch.ones(8)
    for step in range(10):
        progress(step)
        y = funcol.all_reduce(x, "sum", dist.group.WORLD)
        y = funcol.wait_tensor(y) if hasattr(funcol, "wait_tensor") else y
        if RANK == 3 and step == 4:
            hang_here()
        z = funcol.all_gather_tensor(y, 0, dist.group.WORLD)
        g = funcol.reduce_scatter_tensor(z, "sum", 0, dist.group.WORLD)
        x = g.repeat(WS)[:8] / (WS * WS)


def _compiled(stuck_rank, steps):
    # a training step whose collectives torch.compile traces as functional collectives (aot_eager: no C++
    # compiler needed), over tensor-parallel pairs and the world
    pairs = [dist.new_group([r, r + 1]) for r in range(0, WS, 2)]  # new_group is collective: every rank makes all
    pair = pairs[RANK // 2]
    fn = torch.compile(_funcol_step, backend="aot_eager", fullgraph=True)
    x = torch.ones(8)
    for step in range(steps):
        progress(step)
        if RANK == stuck_rank and step == 3:
            hang_here()
        y = fn(x, pair)
        x = fn(y, dist.group.WORLD) / (4 * WS * WS)


def scen_compiled_funcol_hang():
    _compiled(2, 10)


def scen_healthy_compiled_funcol():
    _compiled(-1, 20)


def _writer(stuck):
    from torch.distributed.checkpoint import FileSystemWriter

    class Writer(FileSystemWriter):
        def write_data(self, plan, planner):
            if stuck:
                hang_here()  # a storage write that never returns
            return super().write_data(plan, planner)

    return Writer


def scen_dcp_async_stuck():
    # DCP async_save every 3 steps on a checkpoint group of its own (gloo), training all_reduces meanwhile; the
    # previous save is waited before the next starts; rank 1's storage write hangs in the save of step 3
    import torch.distributed.checkpoint as dcp

    ckpt_pg = dist.new_group(backend="gloo")
    model = nn.Linear(16, 16)
    root = os.path.join("/tmp", f"dcp5-async-{os.path.basename(OUT)}")
    fut = None
    for step in range(12):
        progress(step)
        for p in model.parameters():
            dist.all_reduce(p.data)
            p.data /= WS
        if step % 3 == 0:
            if fut is not None:
                fut.result()
            w = _writer(RANK == 1 and step == 3)(os.path.join(root, f"step{step}"))
            fut = dcp.async_save({"model": model.state_dict()}, storage_writer=w, process_group=ckpt_pg)
        time.sleep(0.05)


def scen_dcp_load_hang():
    # every rank saves a sharded state, then resumes from it with dcp.load at every step's start (an eval
    # reload); rank 2's storage read hangs at step 3
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    class Reader(FileSystemReader):
        stuck = False

        def read_data(self, plan, planner):
            if self.stuck:
                hang_here()
            return super().read_data(plan, planner)

    path = os.path.join("/tmp", f"dcp5-load-{os.path.basename(OUT)}")
    state = {"w": torch.full((8,), float(RANK)), "step": torch.tensor(0)}
    dcp.save(state, checkpoint_id=path)
    for step in range(10):
        progress(step)
        r = Reader(path)
        r.stuck = RANK == 2 and step == 3
        dcp.load(state, storage_reader=r)
        dist.all_reduce(state["w"])
        state["w"] /= WS


def _pipeline(schedule_cls, stuck_rank, steps):
    # two stages per rank (a looped layout: rank r holds stages r and r + WS); the loss is all_reduced after
    # each step; `stuck_rank`'s second stage hangs in its forward at step 3
    from torch.distributed.pipelining import PipelineStage

    class Stage(nn.Module):
        def __init__(self, stuck):
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.stuck = stuck
            self.step = -1

        def forward(self, x):
            if self.stuck and self.step == 3:
                hang_here()
            return torch.relu(self.lin(x))

    torch.manual_seed(0)
    n = 2 * WS
    mods = [Stage(RANK == stuck_rank and s >= WS) for s in (RANK, RANK + WS)]
    stages = [PipelineStage(m, s, n, torch.device("cpu")) for m, s in zip(mods, (RANK, RANK + WS), strict=True)]
    sched = schedule_cls(stages, n_microbatches=WS * 2, loss_fn=lambda out, _t: out.sum())
    for step in range(steps):
        progress(step)
        for m in mods:
            m.step = step
        x = torch.randn(4 * WS, 16)
        if RANK == 0:
            sched.step(x, target=x)
        elif RANK == WS - 1:
            sched.step(target=x)
        else:
            sched.step()
        dist.all_reduce(torch.ones(1))


def scen_interleaved_pp_hang():
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    _pipeline(ScheduleInterleaved1F1B, 1, 10)


def scen_looped_bfs_hang():
    from torch.distributed.pipelining import ScheduleLoopedBFS

    _pipeline(ScheduleLoopedBFS, 0, 10)


def scen_fsdp_clip_skip():
    # FSDP2 (1-D) with gradient clipping (its total-norm all_reduce is inside clip_grad_norm_, on DTensor
    # gradients); at step 3 rank 1 takes a path that skips clipping (a loss-scale overflow check) and goes on
    # to the next step's forward
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = _Net()
    for layer in (model.l1, model.l2, model.l3):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10):
        progress(step)
        model(torch.randn(8, 16)).sum().backward()
        if not (RANK == 1 and step == 3):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()


class _Items(torch.utils.data.Dataset):
    # a persistent worker keeps its copy (and its count) across epochs
    fetched = 0

    def __len__(self):
        return 32

    def __getitem__(self, i):
        self.fetched += 1
        if RANK == 2 and self.fetched == 16 * 2 + 5:
            os._exit(1)  # the worker is killed in its third epoch (a decoder segfault)
        return torch.full((4,), float(i % 7))


def scen_loader_worker_crash():
    # a DataLoader with two persistent workers over several epochs; rank 2's worker dies in epoch 2: the main
    # process raises "DataLoader worker ... exited unexpectedly" (its error-path dump) and exits
    dl = torch.utils.data.DataLoader(_Items(), batch_size=8, num_workers=2, persistent_workers=True,
                                     shuffle=True)
    step = 0
    for epoch in range(6):
        for batch in dl:
            progress(f"{epoch}:{step}")
            dist.all_reduce(batch)
            step += 1


def scen_monitored_two_stuck():
    # every step ends in monitored_barrier(wait_all_ranks=False) with a long timeout; ranks 1 and 4 hang in a
    # metrics flush at step 3: rank 0 waits for them in the barrier, the others in its second part
    t = torch.ones(8)
    for step in range(10):
        progress(step)
        dist.all_reduce(t)
        t = t / WS
        if RANK in (1, 4) and step == 3:
            hang_here()
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=300), wait_all_ranks=False)


def scen_mesh_names_swapped():
    # a (2, 2) DeviceMesh; rank 3's launcher config names its dims the other way round ("tp", "dp"): the groups
    # are made alike on every rank (by dim), but rank 3's mesh["tp"] is the others' mesh["dp"]. Each step an
    # activation sharded over tp is gathered (redistribute Shard -> Replicate) and a gradient is summed over dp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    names = ("tp", "dp") if RANK == 3 else ("dp", "tp")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    tp, dp = mesh["tp"], mesh["dp"]
    for step in range(10):
        progress(step)
        act = DTensor.from_local(torch.ones(2, 4) * RANK, tp, [Shard(0)])
        full = act.redistribute(tp, [Replicate()]).to_local()
        grad = DTensor.from_local(full.sum(0), dp, [Partial()])
        grad.redistribute(dp, [Replicate()]).to_local()


def scen_healthy_hsdp():
    # HSDP (replicate 2 x shard WS/2) with a different compute time per rank at every step
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, WS // 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = _Net()
    _shard_layers(model, mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rng = random.Random(RANK)
    for step in range(16):
        progress(step)
        time.sleep(rng.uniform(0.0, 0.05))
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def scen_loss_parallel_hang():
    # tensor parallel over the world with a vocabulary-sharded output (ColwiseParallel, Shard(-1) outputs) and
    # loss_parallel's cross entropy (its all_reduces of the max and the sum inside the loss); rank 2 hangs
    # between its forward and the loss at step 3
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

    mesh = init_device_mesh("cpu", (WS,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 8 * WS))
    parallelize_module(model, mesh, {"2": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10):
        progress(step)
        torch.manual_seed(step)
        x, y = torch.randn(4, 16), torch.randint(0, 8 * WS, (4,))
        logits = model(x)
        if RANK == 2 and step == 3:
            hang_here()
        with loss_parallel():
            loss = torch.nn.functional.cross_entropy(logits, y)
            loss.backward()
        opt.step()
        opt.zero_grad()


def scen_healthy_ddp_bn_uneven_accum():
    # DDP over a model with BatchNorm and gradient accumulation under no_sync; rank 1's config says 2
    # micro-batches where the others' say 3. A wrong result, but no hang: DDP syncs its buffers (a broadcast
    # from rank 0) only in the forward of a micro-batch that syncs, so every rank issues the same collectives
    # at every step
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    accum = 2 if RANK == 1 else 3
    for step in range(10):
        progress(step)
        for mb in range(accum):
            x = torch.randn(8, 16)
            if mb < accum - 1:
                with ddp.no_sync():
                    ddp(x).sum().backward()
            else:
                ddp(x).sum().backward()
        opt.step()
        opt.zero_grad()


def scen_ddp_straggler():
    # DDP with small buckets (several async all_reduces a step, waited at the backward's end); rank 1's data
    # loading takes 120 ms longer at every step
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)),
        bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    rng = random.Random(RANK)
    for step in range(30):
        progress(step)
        time.sleep(0.02 + rng.uniform(0.0, 0.02) + (0.12 if RANK == 1 else 0.0))
        ddp(torch.randn(16, 32)).sum().backward()
        opt.step()
        opt.zero_grad()


# ---- jobs under torchrun (run.py starts the agents; RANK, WORLD_SIZE from the launcher)


def scen_two_agents_slow_node():
    # two torchrun agents (nodes) of 2 ranks on one host, a c10d rendezvous on loopback; the second node's
    # ranks are slow at every step (a throttled host)
    local = int(os.environ["LOCAL_RANK"])
    node = RANK // int(os.environ["LOCAL_WORLD_SIZE"])
    t = torch.ones(64)
    for step in range(50):
        progress(step)
        time.sleep(0.03 + (0.15 if node == 1 else 0.0) + 0.002 * local)
        dist.all_reduce(t)
        t = t / WS


def scen_two_agents_node_lost():
    # two torchrun agents of 2 ranks each; the controller kills the second node (its agent and its ranks) at
    # step 4: the first node's ranks fail in their all_reduce (error-path dumps)
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        if step == 4 and RANK >= WS // 2:
            hang_here()  # the controller kills this node here
        dist.all_reduce(t)
        t = t / WS
        time.sleep(0.05)


def scen_record_crash():
    # main under torch.distributed.elastic's @record (the error file for torchrun); rank 1 raises inside a
    # DDP forward at step 3
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def train():
        model = torch.nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 16), nn.ReLU()))
        for step in range(12):
            progress(step)
            x = torch.randn(4, 16)
            if RANK == 1 and step == 3:
                x = torch.randn(4, 15)  # a shape bug: the forward raises
            model(x).sum().backward()

    train()


def scen_two_agents_mesh_hang():
    # two torchrun agents of 4 ranks each; a (node, local) DeviceMesh: activations all_reduced within a node,
    # the loss broadcast as an object across nodes; rank 6 hangs in its data loading at step 3
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, WS // 2), mesh_dim_names=("node", "local"))
    local, across = mesh.get_group("local"), mesh.get_group("node")
    t = torch.ones(16)
    for step in range(10):
        progress(step)
        if RANK == 6 and step == 3:
            hang_here()
        dist.all_reduce(t, group=local)
        box = [{"loss": float(t.sum()), "step": step}]
        dist.broadcast_object_list(box, src=dist.get_global_rank(across, 0), group=across)
        t = t / (WS // 2)


# ---- jobs under torch.multiprocessing.spawn (spawn_job.py)


def scen_spawn_hang():
    # an all_reduce and a gather to rank 0 every step; rank 1 hangs at step 4 before the all_reduce
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        if RANK == 1 and step == 4:
            hang_here()
        dist.all_reduce(t)
        dist.gather(t, [torch.empty(8) for _ in range(WS)] if RANK == 0 else None, dst=0)
        t = t / WS

