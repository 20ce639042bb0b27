"""Runs a randprog program's ops on a real gloo job (torch.multiprocessing, loopback) and writes every rank's
`_dump_fr_trace_json()` and `_dump_fr_trace()`: the reference tests/unit/test_randprog_fidelity.py compares
the executor with. Usage: python randprog_torch_worker.py SPEC.json OUT_DIR PORT (SPEC: layout + ops)."""

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = {"Float": torch.float32, "Int": torch.int32, "BFloat16": torch.bfloat16, "Double": torch.float64,
          "Long": torch.int64, "Half": torch.float16, "Byte": torch.uint8}


def _t(shape, dtype):
    return torch.ones(shape, dtype=DTYPES[dtype])


def _coll(op, g, grp, rank):
    api, shape, dtype = op["api"], op["shape"], op["dtype"]
    size, root = len(grp["ranks"]), grp["ranks"][op["root"]]
    t = _t(shape, dtype)
    kw = {"group": g, "async_op": op["is_async"]}
    if api == "all_reduce":
        return dist.all_reduce(t, **kw)
    if api == "broadcast":
        return dist.broadcast(t, root, **kw)
    if api == "reduce":
        return dist.reduce(t, root, **kw)
    if api == "all_gather":
        return dist.all_gather([torch.zeros_like(t) for _ in range(size)], t, **kw)
    if api == "all_gather_into_tensor":
        return dist.all_gather_into_tensor(torch.zeros((size * t.numel(),), dtype=t.dtype), t.flatten(), **kw)
    if api == "reduce_scatter_tensor":
        return dist.reduce_scatter_tensor(torch.zeros((t.numel(),), dtype=t.dtype),
                                          torch.ones((size * t.numel(),), dtype=t.dtype), **kw)
    if api == "all_to_all_single":
        return dist.all_to_all_single(torch.zeros((size * t.numel(),), dtype=t.dtype),
                                      torch.ones((size * t.numel(),), dtype=t.dtype), **kw)
    if api == "barrier":
        return dist.barrier(**kw)
    if api == "gather":
        lst = [torch.zeros_like(t) for _ in range(size)] if rank == root else None
        return dist.gather(t, lst, dst=root, **kw)
    if api == "scatter":
        lst = [torch.ones_like(t) for _ in range(size)] if rank == root else None
        return dist.scatter(torch.zeros_like(t), lst, src=root, **kw)
    if api == "_coalescing_manager":
        n = t.numel()
        with dist._coalescing_manager(group=g, async_ops=True) as cm:
            dist.all_reduce(t, group=g)
            dist.all_reduce(_t((max(1, n // 2),), dtype), group=g)
        cm.wait()
        return None
    raise ValueError(api)


def _write_dumps(rank, out):
    text = torch._C._distributed_c10d._dump_fr_trace_json(True, True)
    with open(os.path.join(out, f"rank_{rank}.json"), "w") as handle:
        handle.write(text if isinstance(text, str) else text.decode())
    with open(os.path.join(out, f"rank_{rank}.pkl"), "wb") as handle:
        handle.write(torch._C._distributed_c10d._dump_fr_trace(True, True, False))


def _settled(limit_s=60.0):
    """Wait until the recorder shows every entry retired and every group's last enqueued collective
    completed, as it does once the program's ops have all returned (at most `limit_s`). False when it
    never did: the dump is then not the end state the test compares."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        text = torch._C._distributed_c10d._dump_fr_trace_json(True, True)
        trace = json.loads(text if isinstance(text, str) else text.decode())
        status = trace.get("pg_status") or {}
        if all(e.get("retired") for e in trace.get("entries") or []) and all(
                s.get("last_completed_collective") == s.get("last_enqueued_collective") for s in status.values()):
            return True
        time.sleep(0.05)
    return False


def _dump_later(rank, world, out, seconds):
    """A hung job: dump while the ranks are blocked (or stuck); once every rank has, end the process (the
    first to end resets its peers' connections: their blocked collectives then fail)."""
    time.sleep(seconds)
    _write_dumps(rank, out)
    open(os.path.join(out, f"done_{rank}"), "w").close()
    while not all(os.path.exists(os.path.join(out, f"done_{r}")) for r in range(world)):
        time.sleep(0.05)
    os._exit(0)


def body(rank, world, spec, out, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if spec.get("dump_after"):
        threading.Thread(target=_dump_later, args=(rank, world, out, spec["dump_after"]), daemon=True).start()
    groups = {0: dist.group.WORLD}
    for i, (_name, desc, ranks, _style) in enumerate(spec["layout"]["groups"][1:], 1):
        groups[i] = dist.new_group(ranks, group_desc=desc)
    infos = [{"ranks": g[2]} for g in spec["layout"]["groups"]]
    pending = []
    for op in spec["ops"][str(rank)]:
        g, kind = groups[op["group"]], op["kind"]
        if kind == "compute":
            time.sleep(op["seconds"])
        elif kind == "coll":
            work = _coll(op, g, infos[op["group"]], rank)
            if op["is_async"] and work is not None:
                pending.append(work)
        elif kind == "wait":
            for work in pending:
                work.wait()
            pending = []
        elif kind == "p2p":
            t = _t(op["shape"], op["dtype"])
            (dist.send if op["send"] else dist.recv)(t, op["peer"], group=g)
        elif kind == "batch":
            ops = [dist.P2POp(dist.isend if is_send else dist.irecv, _t(op["shape"], op["dtype"]), peer, group=g)
                   for is_send, peer in op["posts"]]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        elif kind == "mbarrier":
            dist.monitored_barrier(group=g)
        elif kind == "stuck":
            time.sleep(3600)
        else:
            raise ValueError(kind)
    if spec.get("dump_after"):
        time.sleep(3600)  # the dump thread ends the process
    # gloo retires an entry a moment after wait() returns (longer on a loaded machine)
    if not _settled():
        open(os.path.join(out, f"unsettled_{rank}"), "w").close()
    _write_dumps(rank, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    spec = json.loads(open(sys.argv[1]).read())
    mp.spawn(body, args=(spec["layout"]["world"], spec, sys.argv[2], int(sys.argv[3])), nprocs=spec["layout"]["world"])
