"""One rank of the demo training job: gloo on loopback, a few steps, one injected fault.

Run as ``python -m frscope.demo.job``, one process per rank, with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in the environment (``launcher.py`` does that). This is the only module of ``frscope``
that imports torch; it runs in the rank processes, never in the launcher, sidecar or operator.

Each rank starts torch's worker server on ``<socket-dir>/rank-<RANK>.sock`` right after
``init_process_group``: that socket is how frscope reads the live recorder and the Python stacks
while the rank is blocked (gloo writes no dump on timeout, see DESIGN.md).

The function names (``load_batch``, ``train_step``, ``exchange_halo``, ``save_checkpoint``,
``wait_for_shutdown``) are what a person sees in the stacks; tests look for them, so keep them.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

# The recorder reads its size when the first process group is created; set it before torch loads.
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")

# (_dump_fr_trace is bound in torch's C extension but missing from its type stubs.)
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _WorkerServer  # type: ignore[attr-defined]

from frscope.demo.faults import (
    CRASH_STEP_S,
    FAULT_STEP,
    FAULTS,
    JITTER_MAX_S,
    LAYER_STEPS,
    LAYERS,
    STEP_LATE_S,
    STEPS,
    STRAGGLER_DELAY_S,
    STRAGGLER_STEPS,
    culprit_ranks,
    subgroup_ranks,
)

# The shape every rank passes to the step all_reduce; "size" swaps it on the culprit (same numel).
GRAD_SHAPE = (8, 4)
# "size-bytes" pauses every rank this long before the fault step, so that a poller a tenth of a
# second apart has surely seen the recorders up to the step before (the abort itself takes ms).
SIZE_BYTES_PAUSE_S = 1.0
IDLE_PHASE = "idle"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one rank of the frscope demo job")
    parser.add_argument("--fault", choices=sorted(FAULTS), default="none")
    parser.add_argument("--socket-dir", type=Path, required=True)
    parser.add_argument("--pickle-dump-dir", type=Path, default=None,
                        help="write _dump_fr_trace() bytes to <dir>/<prefix><rank> once <dir>/dump-request "
                        "exists")
    parser.add_argument("--pickle-prefix", default="nccl_trace_rank_")
    parser.add_argument("--max-lifetime", type=float, default=300.0,
                        help="hard deadline: the process exits by itself after this many seconds")
    return parser.parse_args(argv)


def start_deadline(seconds: float) -> None:
    """Exit hard after `seconds`, even when blocked in a collective: the safety net if the launcher dies."""

    def expire() -> None:
        time.sleep(seconds)
        os._exit(3)

    threading.Thread(target=expire, name="frscope-deadline", daemon=True).start()


def mark_phase(socket_dir: Path, rank: int, phase: str) -> None:
    """Tell the launcher this rank reached the part of the run where it stays (blocked or idle).

    Written just *before* the call that blocks, so the launcher still waits for the recorders to
    settle; the marker only keeps it from taking a slow start for a hang.
    """
    marker = socket_dir / f"rank-{rank}.phase"
    tmp = socket_dir / f"rank-{rank}.phase.tmp"
    tmp.write_text(phase)
    tmp.replace(marker)


def start_pickle_dumper(dump_dir: Path, prefix: str, rank: int) -> None:
    """Emulate torch's on-timeout dump: write `_dump_fr_trace()` bytes when the launcher asks.

    The launcher creates `<dump_dir>/dump-request` once every rank is blocked or idle; the dump
    runs on this thread while the main thread sits inside a gloo collective.
    """
    request = dump_dir / "dump-request"
    target = dump_dir / f"{prefix}{rank}"

    def wait_and_dump() -> None:
        while not request.exists():
            time.sleep(0.05)
        data = _dump_fr_trace()
        # Renamed into place so the launcher never copies half a file. (torch writes its own dumps
        # in place; the fixtures should hold what torch produced, not a torn copy.)
        tmp = dump_dir / f".{prefix}{rank}.partial"
        tmp.write_bytes(data)
        tmp.replace(target)

    threading.Thread(target=wait_and_dump, name="frscope-pickle-dump", daemon=True).start()


# --- the "training" -----------------------------------------------------------------------------


def load_batch(step: int, rank: int, fault: str, culprit: bool) -> torch.Tensor:
    if fault in ("hang", "pipeline") and culprit and step == FAULT_STEP:
        # A data loader that never returns: the others wait for this rank in the step's all_reduce.
        while True:
            time.sleep(1.0)
    if fault == "size-bytes" and step == FAULT_STEP:
        time.sleep(SIZE_BYTES_PAUSE_S)
    if fault == "steps" and culprit:
        time.sleep(STEP_LATE_S)  # a slow data loader: late at the step's first collective only
    if fault == "jitter":
        # Uneven but unbiased: each rank draws its own delay per step; no rank is slow on purpose.
        time.sleep(random.Random(rank * 1000 + step).uniform(0.0, JITTER_MAX_S))
    if fault == "crash":
        time.sleep(CRASH_STEP_S)
    return torch.full(GRAD_SHAPE, float(step + rank + 1))


def exchange_halo(rank: int) -> None:
    """Ranks 0 and 1 swap a tensor, but both receive first: a p2p deadlock that gloo does not record."""
    peer = 1 - rank
    buf = torch.zeros(4)
    dist.recv(buf, src=peer)
    dist.send(buf, dst=peer)


def pipeline_forward(rank: int, world: int) -> None:
    """Pass activations down the stages: recv from the previous rank, send to the next (unrecorded by gloo)."""
    activations = torch.zeros(4)
    if rank > 0:
        dist.recv(activations, src=rank - 1)
    if rank < world - 1:
        dist.send(activations, dst=rank + 1)


def write_recorder(dump_dir: Path | None, prefix: str, rank: int) -> None:
    """Write `_dump_fr_trace()` bytes to <dump_dir>/<prefix><rank> (a periodic or an on-failure dump)."""
    if dump_dir is None:
        return
    tmp = dump_dir / f".{prefix}{rank}.partial"
    tmp.write_bytes(_dump_fr_trace())
    tmp.replace(dump_dir / f"{prefix}{rank}")


def forward_layers(grads: torch.Tensor, layers: int, subgroup: dist.ProcessGroup | None, skip_subgroup: bool) -> None:
    """One step of "steps"/"jitter"/"crossgroup": the layers' all_reduces, in lockstep once every rank is in."""
    if subgroup is not None and not skip_subgroup:
        dist.all_reduce(grads, group=subgroup)  # e.g. a tensor-parallel reduction
    for _ in range(layers):
        dist.all_reduce(grads)


def train_step(step: int, rank: int, fault: str, culprit: bool, subgroup: dist.ProcessGroup | None = None) -> None:
    grads = load_batch(step, rank, fault, culprit)
    at_fault = step == FAULT_STEP
    if fault in ("steps", "jitter"):
        forward_layers(grads, LAYERS, None, False)
        return
    if fault == "crossgroup":
        # The culprit skips the subgroup's all_reduce and goes straight on to the default group's.
        forward_layers(grads, 1, subgroup, skip_subgroup=culprit and at_fault)
        return
    if fault == "pipeline" and at_fault:
        pipeline_forward(rank, dist.get_world_size())
    if fault == "crash" and culprit and at_fault:
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does: no exception, no dump
    if fault == "p2p" and at_fault and culprit:
        exchange_halo(rank)
    if culprit and at_fault:
        if fault == "skip":
            return  # the skipped all_reduce: this rank's later ones pair with the others' earlier ones
        if fault == "type":
            dist.broadcast(grads, src=0)
            return
        if fault == "size":
            grads = grads.reshape(GRAD_SHAPE[::-1]).contiguous()  # [4, 8]: same bytes, other shape
        if fault == "dtype":
            grads = grads.to(torch.int32)  # same bytes as float32: gloo sums the bits silently
        if fault == "size-bytes":
            grads = torch.ones(GRAD_SHAPE[0] * 2, GRAD_SHAPE[1])  # twice the bytes: the receiver aborts
    dist.all_reduce(grads)


def save_checkpoint() -> None:
    # Where the rank that skipped a step sits: it has finished its steps and waits forever.
    while True:
        time.sleep(1.0)


def wait_for_shutdown() -> None:
    # A rank after training: idle, still answering on its socket, until the launcher ends it.
    while True:
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start_deadline(args.max_lifetime)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    fault: str = args.fault
    culprit = rank in culprit_ranks(fault, world)

    dist.init_process_group("gloo", rank=rank, world_size=world)
    # Kept referenced for the life of the process: the server stops when the object is collected.
    server = _WorkerServer(str(args.socket_dir / f"rank-{rank}.sock"))
    if args.pickle_dump_dir is not None:
        start_pickle_dumper(args.pickle_dump_dir, args.pickle_prefix, rank)

    # A second process group, so the recorders hold more than one: its ranks broadcast the starting
    # parameters once. Every rank must call new_group, members or not.
    sub_ranks = subgroup_ranks(world)
    subgroup = dist.new_group(ranks=sub_ranks, group_desc="param_sync")
    if rank in sub_ranks:
        params = torch.arange(16, dtype=torch.float32) if rank == 0 else torch.zeros(16)
        dist.broadcast(params, src=0, group=subgroup)

    steps = {"straggler": STRAGGLER_STEPS, "steps": LAYER_STEPS, "jitter": LAYER_STEPS}.get(fault, STEPS)
    ends_hung = fault in ("hang", "skip", "type", "p2p", "crossgroup", "pipeline")
    in_subgroup = subgroup if rank in sub_ranks else None
    for step in range(steps):
        if ends_hung and step == FAULT_STEP:
            mark_phase(args.socket_dir, rank, f"step-{step}")
        if fault == "straggler" and culprit:
            time.sleep(STRAGGLER_DELAY_S)
        try:
            train_step(step, rank, fault, culprit, in_subgroup)
        except RuntimeError:
            if fault != "crash":
                raise
            # A survivor: its all_reduce failed when the culprit died. Dump the recorder as it fails
            # (gloo writes none itself), the way a training script's error handler would.
            write_recorder(args.pickle_dump_dir, args.pickle_prefix, rank)
            return 1
        if fault == "crash" and culprit and step == 0:
            write_recorder(args.pickle_dump_dir, args.pickle_prefix, rank)  # a periodic dump, soon stale

    if fault == "skip" and culprit:
        mark_phase(args.socket_dir, rank, "save_checkpoint")
        save_checkpoint()
    mark_phase(args.socket_dir, rank, IDLE_PHASE)
    wait_for_shutdown()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
