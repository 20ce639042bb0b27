"""The third batch of hand-written scenarios (one rank each; job.py runs them by name): layouts and timings
the first two batches did not have (non-contiguous and nested groups, families of description-less groups,
a world group left idle, uneven all_to_all routing, stale dumps of a rank that died later, pauses on every
rank). Each injects one fault, or none; the truth the controller writes says which."""

import datetime
import os
import random
import threading
import time

import torch
import torch.distributed as dist
from rankio import RANK, WS, hang_here, progress, write_dumps


def _mine(layout):
    # every rank creates every group of a layout (new_group is collective), and keeps its own
    groups = [dist.new_group(ranks) for ranks in layout]
    return next(g for g, ranks in zip(groups, layout, strict=True) if RANK in ranks)


def scen_noncontig_hang():
    # two non-contiguous subgroups of 3, then the world; rank 2 hangs before its subgroup's all_reduce
    sub = _mine([[0, 2, 5], [1, 3, 4]])
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        if RANK == 2 and step == 3:
            hang_here()
        dist.all_reduce(t, group=sub)
        dist.all_reduce(t)
        t = t / 18


def scen_overlap_families():
    # rows of 4 and parities of 4 (two overlapping families) and the world every other step; rank 5 hangs
    # between its row's and its parity's all_reduce
    row = _mine([[0, 1, 2, 3], [4, 5, 6, 7]])
    par = _mine([[0, 2, 4, 6], [1, 3, 5, 7]])
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        dist.all_reduce(t, group=row)
        if RANK == 5 and step == 4:
            hang_here()
        dist.all_reduce(t, group=par)
        if step % 2 == 0:
            dist.all_reduce(t)
        t = t / 16


def scen_world_idle_hang():
    # two independent replicas of 3 ranks; the world group only at the start and the end; rank 4 hangs at
    # step 5: its replica waits in its all_reduce, the other replica finishes and waits in the end barrier
    sub, _ = dist.new_subgroups_by_enumeration([[0, 1, 2], [3, 4, 5]])
    dist.barrier()
    t = torch.ones(8)
    for step in range(16):
        progress(step)
        if RANK == 4 and step == 5:
            hang_here()
        dist.all_reduce(t, group=sub)
        dist.broadcast(t, src=0 if RANK < 3 else 3, group=sub)
        t = t / 3
    dist.barrier()


def scen_async_two_groups_hang():
    # a tensor-parallel pair all_reduce and a world all_reduce, both async, waited in reverse; rank 3 is
    # stuck in Python between issuing the two at step 4
    pair = _mine([[i, i + 1] for i in range(0, WS, 2)])
    a, b = torch.ones(8), torch.ones(8)
    for step in range(12):
        progress(step)
        w1 = dist.all_reduce(a, group=pair, async_op=True)
        if RANK == 3 and step == 4:
            hang_here()
        w2 = dist.all_reduce(b, async_op=True)
        w2.wait()
        w1.wait()


def _splits(src, step):
    return [1 + (src * 7 + dst * 3 + step) % 4 for dst in range(WS)]


def scen_healthy_moe_uneven():
    # MoE token routing with uneven splits (every rank sends each peer a different count, every step)
    for step in range(30):
        progress(step)
        ins = _splits(RANK, step)
        outs = [_splits(src, step)[RANK] for src in range(WS)]
        out = torch.empty(sum(outs))
        dist.all_to_all_single(out, torch.ones(sum(ins)), output_split_sizes=outs, input_split_sizes=ins)
        dist.all_reduce(torch.ones(4))
        time.sleep(0.01)


def scen_stale_crash():
    # every step computes for a while; rank 3's periodic dump thread writes its dump at step 2 (the later
    # ones were not collected); rank 3 is killed at step 10 (no dump then), while the others wait for it in
    # the step's all_reduce
    t = torch.ones(8)
    dumper = None
    for step in range(16):
        progress(step)
        time.sleep(0.7)
        if RANK == 3 and step == 2:
            dumper = threading.Thread(target=write_dumps, kwargs={"freeze": True})
            dumper.start()
        if RANK == 3 and step == 10:
            dumper.join()
            os._exit(1)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        t = t / 5


def scen_healthy_compute_pause():
    # every rank pauses for a long CPU evaluation after step 9 (no collective pending): captured mid-pause
    t = torch.ones(16)
    for step in range(10):
        progress(step)
        dist.all_reduce(t)
        t = t / WS
    progress("eval")
    time.sleep(60)


def scen_healthy_grad_accum():
    # DDP with gradient accumulation (no_sync for 3 micro-batches, sync on the 4th); every micro-batch
    # takes a different time on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    rng = random.Random(RANK)
    for step in range(10):
        progress(step)
        for mb in range(4):
            time.sleep(rng.uniform(0.0, 0.08))
            if mb < 3:
                with ddp.no_sync():
                    ddp(torch.randn(8, 16)).sum().backward()
            else:
                ddp(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def scen_reduce_root_stuck():
    # the loss is reduced to rank 3 (the logging rank) every step; rank 3 hangs writing its log at step 4
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        t = t / 5
        if RANK == 3 and step == 4:
            hang_here()
        dist.reduce(torch.ones(2), dst=3)


def scen_bcast_obj_barrier():
    # a config object broadcast from 0, then a barrier, every step; rank 4 hangs after the broadcast
    t = torch.ones(8)
    for step in range(10):
        progress(step)
        dist.all_reduce(t)
        t = t / 6
        cfg = [{"step": step, "lr": 0.1}] if RANK == 0 else [None]
        dist.broadcast_object_list(cfg, src=0)
        if RANK == 4 and step == 3:
            hang_here()
        dist.barrier()


def scen_nested_subgroups():
    # subgroups of 4, each split again into pairs (both new_subgroups, no descriptions), the world every 3rd
    # step; rank 6 hangs between its pair's and its quad's all_reduce
    quad, _ = dist.new_subgroups(group_size=4)
    pair, _ = dist.new_subgroups(group_size=2)
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        dist.all_reduce(t, group=pair)
        if RANK == 6 and step == 3:
            hang_here()
        dist.all_reduce(t, group=quad)
        if step % 3 == 2:
            dist.all_reduce(t)
        t = t / 96


def scen_straggler_rank0():
    # three ranks; rank 0 (which also logs) is late at every step
    t = torch.ones(64)
    for step in range(50):
        progress(step)
        time.sleep(0.03 + (0.15 if RANK == 0 else 0.0))
        dist.all_reduce(t)
        dist.broadcast(t, src=1)
        t = t / 3


def scen_slow_tp_node():
    # tensor-parallel groups of 3 (a node each) and data-parallel pairs across them, no world op; the second
    # node (ranks 3, 4, 5) is slow at every step
    tp = _mine([[0, 1, 2], [3, 4, 5]])
    dp = _mine([[0, 3], [1, 4], [2, 5]])
    t = torch.ones(32)
    for step in range(50):
        progress(step)
        time.sleep(0.03 + (0.15 if RANK >= 3 else 0.0))
        dist.all_reduce(t, group=tp)
        dist.all_reduce(t, group=dp)
        t = t / 6


def scen_healthy_three_groups_async():
    # pairs, strided triples and the world, all async, interleaved and waited in a different order; each rank
    # computes a different time between them
    pair = _mine([[0, 1], [2, 3], [4, 5]])
    tri = _mine([[0, 2, 4], [1, 3, 5]])
    rng = random.Random(RANK)
    a, b, c = torch.ones(16), torch.ones(16), torch.ones(16)
    for step in range(30):
        progress(step)
        wa = dist.all_reduce(a, group=pair, async_op=True)
        time.sleep(rng.uniform(0.0, 0.02))
        wb = dist.all_reduce(b, group=tri, async_op=True)
        wc = dist.all_reduce(c, async_op=True)
        wb.wait()
        wc.wait()
        wa.wait()
        a, b, c = a / 2, b / 3, c / 6


def scen_crash_in_subgroup():
    # uneven replicas [0, 1, 2] and [3, 4], then the world; rank 4 raises at step 4 (its error-path dump is
    # written) before its replica's all_reduce
    sub, _ = dist.new_subgroups_by_enumeration([[0, 1, 2], [3, 4]])
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        if RANK == 4 and step == 4:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        dist.all_reduce(t, group=sub)
        dist.all_reduce(t)
        t = t / 15


def scen_sub_dtype():
    # a non-contiguous group [1, 3, 4] sums a statistic in float32; rank 4 sends float64 at step 3
    sub = _mine([[1, 3, 4], [0, 2]])
    t = torch.ones(8)
    for step in range(10):
        progress(step)
        dist.all_reduce(t)
        t = t / 5
        dt = torch.float64 if (RANK == 4 and step == 3) else torch.float32
        dist.all_reduce(torch.ones(6, dtype=dt), group=sub)


def scen_a2a_uneven_mismatch():
    # MoE routing with uneven splits; at step 4 rank 3 routes one more token to rank 0 than rank 0 expects
    for step in range(12):
        progress(step)
        ins = _splits(RANK, step)
        if RANK == 3 and step == 4:
            ins[0] += 1
        outs = [_splits(src, step)[RANK] for src in range(WS)]
        out = torch.empty(sum(outs))
        dist.all_to_all_single(out, torch.ones(sum(ins)), output_split_sizes=outs, input_split_sizes=ins)
        dist.all_reduce(torch.ones(4))


def scen_batch_ring_wrong_peer():
    # a ring exchange by batch_isend_irecv (send to the next, receive from the previous), then a world
    # all_reduce; at step 3 rank 2 posts its receive from rank 0 instead of rank 1
    x, y = torch.ones(8), torch.empty(8)
    for step in range(12):
        progress(step)
        prv = 0 if (RANK == 2 and step == 3) else (RANK - 1) % WS
        ops = [dist.P2POp(dist.isend, x, (RANK + 1) % WS), dist.P2POp(dist.irecv, y, prv)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        dist.all_reduce(y)
        x = y / WS


def scen_lazy_group_hang():
    # the eval group is created lazily at step 5 (new_group is collective); rank 1 hangs loading the eval
    # set before creating it, the others wait inside new_group
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        t = t / 5
        if step == 5:
            if RANK == 1:
                hang_here()
            ev = dist.new_group([0, 1, 2, 3, 4])
            dist.all_reduce(t, group=ev)


def scen_ddp_subgroup_hang():
    # replicas of 3 (a 2x3 grid): DDP over the data-parallel pairs [0, 3], [1, 4], [2, 5], a tensor-parallel
    # all_reduce of the activations first; rank 4 hangs in its forward at step 3
    tp = _mine([[0, 1, 2], [3, 4, 5]])
    dp = _mine([[0, 3], [1, 4], [2, 5]])
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=dp)
    for step in range(10):
        progress(step)
        x = torch.randn(8, 16)
        dist.all_reduce(x, group=tp)
        if RANK == 4 and step == 3:
            hang_here()
        ddp(x).sum().backward()


def scen_ckpt_thread_hang():
    # an async checkpoint thread on its own group gathers shard metadata every 3 steps; the training thread
    # all_reduces every step and joins the previous checkpoint before starting the next; rank 2's checkpoint
    # thread hangs (a stuck file write) before its gather at step 3
    ckg = dist.new_group()
    t = torch.ones(8)
    saver = None

    def save(step):
        if RANK == 2 and step == 3:
            hang_here()
        meta = torch.empty(2 * WS)
        dist.all_gather_into_tensor(meta, torch.tensor([float(RANK), float(step)]), group=ckg)

    for step in range(12):
        progress(step)
        dist.all_reduce(t)
        t = t / WS
        if step % 3 == 0:
            if saver is not None:
                saver.join()
            saver = threading.Thread(target=save, args=(step,), name="async_ckpt")
            saver.start()


def scen_local_sync_hang():
    # pair groups created only by their members (use_local_synchronization), then the world; rank 3 hangs
    # between its pair's all_reduce and the world's
    pair = dist.new_group([RANK - RANK % 2, RANK - RANK % 2 + 1], use_local_synchronization=True)
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        dist.all_reduce(t, group=pair)
        if RANK == 3 and step == 4:
            hang_here()
        dist.all_reduce(t)
        t = t / 12


def scen_sub_op_mismatch():
    # strided triples [0, 2, 4] and [1, 3, 5] sum a statistic; at step 3 rank 4 takes another code path and
    # all_gathers it instead
    tri = _mine([[0, 2, 4], [1, 3, 5]])
    t = torch.ones(6)
    for step in range(10):
        progress(step)
        dist.all_reduce(t)
        t = t / 6
        s = torch.ones(6)
        if RANK == 4 and step == 3:
            dist.all_gather_into_tensor(torch.empty(18), s, group=tri)
        else:
            dist.all_reduce(s, group=tri)


def scen_tp1_hang():
    # a tensor-parallel size of 1 (Megatron-style groups built anyway: one single-rank group per rank) and a
    # data-parallel group of all; rank 2 hangs between its single-rank all_reduce and the data-parallel one
    tp = _mine([[r] for r in range(WS)])
    dp = _mine([list(range(WS))])
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        dist.all_reduce(t, group=tp)
        if RANK == 2 and step == 4:
            hang_here()
        dist.all_reduce(t, group=dp)
        t = t / WS


def scen_healthy_tp1():
    # the same single-rank tensor-parallel groups, healthy, with a broadcast inside each and uneven compute
    tp = _mine([[r] for r in range(WS)])
    dp = _mine([list(range(WS))])
    rng = random.Random(RANK)
    t = torch.ones(8)
    for step in range(30):
        progress(step)
        time.sleep(rng.uniform(0.0, 0.03))
        dist.all_reduce(t, group=tp)
        dist.broadcast(t, src=RANK, group=tp)
        dist.all_reduce(t, group=dp)
        t = t / WS


class _Stats:
    # a metrics object whose pickling blocks on rank 4 at step 3 (a lock its logger thread never releases)
    def __init__(self, step):
        self.step = step

    def __reduce__(self):
        if RANK == 4 and self.step == 3:
            hang_here()
        return (_Stats, (self.step,))


def scen_object_pickle_hang():
    # stats all_gather_object'ed every step; rank 4 hangs inside pickling its object (in torch's call)
    t = torch.ones(8)
    for step in range(10):
        progress(step)
        dist.all_reduce(t)
        t = t / 5
        out = [None] * WS
        dist.all_gather_object(out, _Stats(step))


def scen_error_flag_mismatch():
    # every step ends in a barrier; at step 4 rank 1 catches an exception and, on its error path, all_reduces
    # an error flag (the others do not: they are in the barrier)
    t = torch.ones(8)
    for step in range(10):
        progress(step)
        dist.all_reduce(t)
        t = t / 4
        try:
            if RANK == 1 and step == 4:
                raise ValueError("bad batch")
        except ValueError:
            dist.all_reduce(torch.ones(1))
        dist.barrier()


def scen_intermittent_straggler():
    # rank 3 pauses (a garbage collection) at every other step only
    t = torch.ones(64)
    for step in range(60):
        progress(step)
        time.sleep(0.03 + (0.2 if (RANK == 3 and step % 2) else 0.0))
        dist.all_reduce(t)
        t = t / 4


def scen_sub_timeout():
    # replicas of 3 on groups with a short timeout, then the world; rank 1 hangs before its replica's
    # all_reduce at step 3: ranks 0 and 2 time out there and fail (their error-path dumps), while the other
    # replica waits in the world's all_reduce
    sub, _ = dist.new_subgroups_by_enumeration([[0, 1, 2], [3, 4, 5]], timeout=datetime.timedelta(seconds=4))
    t = torch.ones(8)
    for step in range(12):
        progress(step)
        if RANK == 1 and step == 3:
            hang_here()
        dist.all_reduce(t, group=sub)
        dist.all_reduce(t)
        t = t / 18
