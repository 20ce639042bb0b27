"""One rank of a sweep job: gloo on loopback, the spec's groups and ops, the spec's fault.

Runs in a process forked from the zygote (`zygote.py`), which imported torch once. Standard library and
torch only: it also runs in other torch versions' venvs, where frscope's dependencies are not installed.

Files, in the job's capture directory `cap` and its short work directory `work` (sockets live there):
- `work/rank-<r>.phase`: the rank reached the part of the run where it stays (written before it blocks);
- `work/dump-request`: the controller asks every rank for torch's dumps; the rank's dumper thread then
  writes `cap/pickle/nccl_trace_rank_<r>` (`_dump_fr_trace()`) and `cap/json/nccl_trace_rank_<r>.json`
  (`_dump_fr_trace_json()`), unless the rank wrote them itself on its error path;
- the worker server's socket `work/rank-<r>.sock` is started by frscope's zero-code bootstrap
  (sitecustomize on PYTHONPATH), as in a real pod.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json  # type: ignore[attr-defined]

SHAPE = (8, 4)
DEFAULT_TIMEOUT_S = 300.0
_DUMPED = threading.Lock()


class Job:
    def __init__(self, spec: dict[str, Any], rank: int, cap: Path, work: Path) -> None:
        self.spec = spec
        self.rank = rank
        self.world = int(spec["world"])
        self.cap = cap
        self.work = work
        self.cls: str = spec["cls"]
        self.params: dict[str, Any] = spec["params"]
        self.culprit = rank in spec["culprits"]
        self.ops: list[tuple[str, str]] = [(str(op[0]), str(op[1])) for op in self.params["ops"]]
        self.groups: dict[str, Any] = {}
        self.group_ranks: dict[str, list[int]] = {}
        self.dumped = False

    # -- setup ------------------------------------------------------------------------------------

    def init(self) -> None:
        timeout = timedelta(seconds=float(self.params.get("timeout_s", DEFAULT_TIMEOUT_S)))
        store = dist.FileStore(  # type: ignore[attr-defined]
            str(self.work / "store"), self.world)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world, timeout=timeout)
        self.groups["world"] = None
        self.group_ranks["world"] = list(range(self.world))
        layout, tp, world = self.spec["layout"], int(self.spec["tp"]), self.world
        blocks = [list(range(s, s + tp)) for s in range(0, world, tp)] if tp else []
        strides = [list(range(i, world, tp)) for i in range(tp)] if tp else []
        layouts: dict[str, list[tuple[str, list[list[int]]]]] = {
            "grid": [("tp", blocks), ("dp", strides)],
            "hsdp": [("shard", blocks), ("replicate", strides)],
            "strided": [("strided", [list(range(0, world, 2)), list(range(1, world, 2))])],
        }
        for name, partition in layouts.get(layout, []):
            for members in partition:  # every rank creates every group, members or not
                group = dist.new_group(ranks=members, group_desc=name, timeout=timeout)
                if self.rank in members:
                    self.groups[name] = group
                    self.group_ranks[name] = members

    def start_dumper(self) -> None:
        request = self.work / "dump-request"

        def wait_and_dump() -> None:
            while not request.exists():
                time.sleep(0.05)
            self.write_dumps()

        threading.Thread(target=wait_and_dump, name="sweep-dumper", daemon=True).start()

    def write_dumps(self) -> None:
        """torch's two dump forms, renamed into place; once per rank (the error path or the request)."""
        with _DUMPED:
            if self.dumped:
                return
            self.dumped = True
            for sub, name, data in (
                ("pickle", f"nccl_trace_rank_{self.rank}", _dump_fr_trace()),
                ("json", f"nccl_trace_rank_{self.rank}.json", _dump_fr_trace_json()),
            ):
                folder = self.cap / sub
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / f".{name}.partial"
                tmp.write_bytes(data if isinstance(data, bytes) else data.encode())
                tmp.replace(folder / name)

    def write_periodic(self) -> None:
        """A periodic dump (the stale class): overwritten every step, never marked as the final one."""
        for sub, name, data in (
            ("pickle", f"nccl_trace_rank_{self.rank}", _dump_fr_trace()),
            ("json", f"nccl_trace_rank_{self.rank}.json", _dump_fr_trace_json()),
        ):
            folder = self.cap / sub
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{name}.partial"
            tmp.write_bytes(data if isinstance(data, bytes) else data.encode())
            tmp.replace(folder / name)

    def mark(self, phase: str) -> None:
        tmp = self.work / f".rank-{self.rank}.phase"
        tmp.write_text(phase)
        tmp.replace(self.work / f"rank-{self.rank}.phase")

    # -- the ops ----------------------------------------------------------------------------------

    def group_of(self, name: str) -> tuple[Any, list[int]]:
        return self.groups.get(name), self.group_ranks.get(name, [])

    def tensor(self, step: int, fault: str | None) -> torch.Tensor:
        t = torch.full(SHAPE, float(step + self.rank + 1))
        if fault == "size":
            t = t.reshape(SHAPE[::-1]).contiguous()  # same bytes, another shape: gloo completes silently
        elif fault == "dtype":
            t = t.to(torch.int32)  # same bytes: gloo sums the bits silently
        return t

    def run_op(self, op: str, group_name: str, step: int, fault: str | None) -> None:
        if group_name == "p2p":
            pipeline_forward(self.rank, self.world)
            return
        group, members = self.group_of(group_name)
        if group is None and group_name != "world":
            return  # not a member (cannot happen with the layouts above)
        size = len(members)
        first = members[0]
        t = self.tensor(step, fault)
        if fault == "type" or (fault == "barrier" and op == "all_reduce"):
            if fault == "type":
                dist.broadcast(t, src=first, group=group)
            else:
                dist.barrier(group=group)
            return
        if op == "all_reduce":
            dist.all_reduce(t, group=group)
        elif op == "broadcast":
            dist.broadcast(t, src=first, group=group)
        elif op == "all_gather_into_tensor":
            # The output's chunks have the rank's own input shape (gloo checks that locally).
            out = torch.zeros((size * t.shape[0], t.shape[1]), dtype=t.dtype)
            dist.all_gather_into_tensor(out, t, group=group)
        elif op == "reduce_scatter_tensor":
            big = torch.ones((size * SHAPE[0], SHAPE[1]), dtype=t.dtype)
            if fault == "size":
                big = big.reshape(size * SHAPE[1], SHAPE[0]).contiguous()
            dist.reduce_scatter_tensor(torch.zeros(SHAPE, dtype=t.dtype) if fault != "size" else t, big, group=group)
        elif op == "all_to_all_single":
            if fault == "a2a" and self.params.get("a2a") == "hang":
                # One element fewer for the group's first rank: it (and the ranks after it in gloo's
                # exchange) wait for the rest until the collective's timeout.
                splits = [1] + [2] * (size - 1)
                dist.all_to_all_single(torch.zeros(2 * size), torch.ones(2 * size - 1),
                                       output_split_sizes=[2] * size, input_split_sizes=splits, group=group)
            elif fault == "a2a":
                # One element more for the group's first rank: its receive does not match, it aborts.
                splits = [3] + [2] * (size - 1)
                dist.all_to_all_single(torch.zeros(2 * size), torch.ones(2 * size + 1),
                                       output_split_sizes=[2] * size, input_split_sizes=splits, group=group)
            else:
                dist.all_to_all_single(torch.zeros(2 * size), torch.ones(2 * size), group=group)
        elif op == "barrier":
            dist.barrier(group=group)
        elif op == "reduce":
            dist.reduce(t, dst=first, group=group)
        elif op == "gather":
            bufs = [torch.zeros(SHAPE) for _ in members] if self.rank == first else None
            dist.gather(t, bufs, dst=first, group=group)
        elif op == "scatter":
            pieces = [torch.ones(SHAPE) for _ in members] if self.rank == first else None
            dist.scatter(t, pieces, src=first, group=group)
        elif op == "async_buckets":
            count = int(self.params.get("buckets", 3))
            works = [dist.all_reduce(torch.full((64,), float(b)), group=group, async_op=True) for b in range(count)]
            for work in works:
                work.wait()
        else:
            raise ValueError(f"unknown op {op}")

    # -- the run ----------------------------------------------------------------------------------

    def step(self, step: int) -> None:
        cls, at_step = self.cls, step == self.spec["fault_step"]
        delay = float(self.params.get("delay_s", 0.0))
        if cls == "healthy":
            time.sleep(random.uniform(0.0, float(self.params["jitter_s"])))
        time.sleep(float(self.params.get("step_s", 0.0)))
        if self.culprit and cls == "straggler-steps":
            time.sleep(delay)
        if at_step:
            self.mark(f"step-{step}")
        ops = list(self.ops)
        index = 0
        while index < len(ops):
            op, group = ops[index]
            at = at_step and self.culprit and index == self.spec["op_index"]
            if self.culprit and cls in ("straggler", "straggler-2"):
                time.sleep(delay)
            if self.culprit and cls == "straggler-tp" and group == "tp":
                time.sleep(delay)  # compute before the tp reduction; the tp peer waits, then both are late
            fault = None
            if at:
                if cls in ("hang", "hang-strided", "two-hang", "async", "pipeline", "timeout", "after-timeout"):
                    stuck(str(self.params["function"]))
                elif cls == "gil":
                    hold_gil()
                elif cls in ("crash", "stale"):
                    crash(str(self.params.get("how", "raise")))
                elif cls in ("skip", "cycle"):
                    index += 1
                    continue
                elif cls == "order":
                    # The default group's collective first, then this subgroup's (and any between).
                    later = next(j for j in range(index + 1, len(ops)) if ops[j][1] == "world")
                    self.run_op(*ops[later], step, None)
                    for j in range(index, later):
                        self.run_op(*ops[j], step, None)
                    index = later + 1
                    continue
                elif cls == "p2p":
                    peer = [r for r in self.spec["culprits"] if r != self.rank][0]
                    exchange_halo(peer)
                else:
                    fault = cls  # type, size, dtype, barrier, a2a
            self.run_op(op, group, step, fault)
            index += 1

    def wait_for_server(self) -> None:
        """Until the bootstrap's worker server listens (its thread starts it within a second of the group):
        a real job trains for minutes before it breaks; here the fault may come a few ms after init."""
        end = time.monotonic() + 15.0
        while not (self.work / f"rank-{self.rank}.sock").exists() and time.monotonic() < end:
            time.sleep(0.05)

    def run(self) -> int:
        self.init()
        self.wait_for_server()
        self.start_dumper()
        steps = int(self.spec["steps"])
        if self.cls == "early-exit" and self.culprit:
            steps = int(self.spec["fault_step"])  # its data ran out: it finishes early, exits 0
        for step in range(steps):
            try:
                self.step(step)
            except RuntimeError as exc:
                # A collective failed (a peer died, the timeout fired): dump as a training script's error
                # handler would (gloo writes none itself), then end the way the class says.
                print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                self.write_dumps()
                if self.cls == "after-timeout":
                    self.mark("error")
                    wait_for_shutdown()
                return 1
            if self.cls == "stale" and step < int(self.spec["fault_step"]):
                self.write_periodic()
        if self.cls == "early-exit" and self.culprit:
            return 0
        if self.cls == "teardown":
            self.mark("teardown")
            try:
                teardown(skip_barrier=self.culprit)
            except RuntimeError as exc:
                print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                self.write_dumps()
                return 1
        self.mark("idle")
        wait_for_shutdown()
        return 0


# Named functions: what a person sees in the stacks.
def load_batch() -> None:
    while True:
        time.sleep(0.5)


def compute_loss() -> None:
    while True:
        time.sleep(0.5)


def save_checkpoint() -> None:
    while True:
        time.sleep(0.5)


def log_metrics() -> None:
    while True:
        time.sleep(0.5)


def prefetch_shards() -> None:
    while True:
        time.sleep(0.5)


_STUCK = {f.__name__: f for f in (load_batch, compute_loss, save_checkpoint, log_metrics, prefetch_shards)}


def stuck(function: str) -> None:
    _STUCK[function]()


def hold_gil() -> None:
    """Catastrophic backtracking: one C call that holds the GIL for hours; only SIGKILL ends it."""
    re.match(r"(a+)+$", "a" * 48 + "b")


def crash(how: str) -> None:
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does: no exception, no dump
    raise ValueError("bad value in batch: loss is NaN")  # uncaught: the rank exits 1 with a traceback


def exchange_halo(peer: int) -> None:
    """Both culprits receive first: a p2p deadlock gloo does not record."""
    buf = torch.zeros(4)
    dist.recv(buf, src=peer)
    dist.send(buf, dst=peer)


def pipeline_forward(rank: int, world: int) -> None:
    activations = torch.zeros(4)
    if rank > 0:
        dist.recv(activations, src=rank - 1)
    if rank < world - 1:
        dist.send(activations, dst=rank + 1)


def teardown(skip_barrier: bool) -> None:
    """The end of training: a barrier, then the process group goes. The culprit skips the barrier and gets
    stuck after destroying its group, joining workers that never finish."""
    if not skip_barrier:
        dist.barrier()
    dist.destroy_process_group()
    if skip_barrier:
        join_workers()


def join_workers() -> None:
    while True:
        time.sleep(0.5)


def wait_for_shutdown() -> None:
    while True:
        time.sleep(0.5)


def start_deadline(seconds: float) -> None:
    def expire() -> None:
        time.sleep(seconds)
        os._exit(3)

    threading.Thread(target=expire, name="sweep-deadline", daemon=True).start()


def main(spec: dict[str, Any], rank: int, cap: Path, work: Path, lifetime_s: float) -> int:
    start_deadline(lifetime_s)
    random.seed(int(spec["seed"]) * 1000 + rank)
    return Job(spec, rank, cap, work).run()
