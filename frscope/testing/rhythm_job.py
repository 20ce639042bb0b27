"""A training-shaped gloo job with a rhythm of its own, for the stall and straggler tests and the
detection benchmark (bench/detection.py). Run as a script, one process per rank (frscope.testing.
rhythm_launch starts it): it imports nothing of frscope, so the zero-code bootstrap on PYTHONPATH is
what serves its recorder.

Each step: compute (a sleep of --step-s, plus a random 0..--jitter-s, times --slow-factor on the
--culprit), then --layers all_reduces on the default group. Optional phases between steps:
  --pause-every N --pause-s S   every rank pauses S seconds (up to --pause-max-s, drawn the same on
                                every rank) with nothing in flight (a checkpoint written by every
                                rank, an evaluation without collectives)
  --eval-every N --eval-steps M  M evaluation steps: half the compute, one all_reduce each
  --lone-every N --lone-s S     only rank 0 pauses (it writes the checkpoint); the others wait in
                                the next step's first all_reduce
  --hang-step K                 the culprit never returns from `stuck_in_python`, at a random point
                                of step K's compute; it first writes the time it stopped to
                                <out>/hang-<rank>
  --slow-factor F               the culprit's compute takes F x as long from --slow-from-step on (it
                                writes the time that step began to <out>/slow-<rank>)
  --pattern P                   what a step's communication is: `all_reduce` (the default: --layers
                                all_reduces after the compute); `monitored_barrier` (the all_reduces
                                first, then the compute, then `monitored_barrier`: the culprit stops
                                after the all_reduces, the others wait in the barrier, which gloo's
                                recorder does not record); `pipeline` (torch.distributed.pipelining's
                                GPipe over one stage per rank, the compute in the stages' forward,
                                then one all_reduce of the loss: p2p, which gloo does not record)
Every rank writes <out>/done-<rank> after its last step and exits 0, and keeps <out>/phase-<rank>
saying what it does now (`step N`, `pause`, `eval`, `lone`) and since when (ns): what a benchmark
reads when something is suspected.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-s", type=float, default=0.25)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--jitter-s", type=float, default=0.0)
    p.add_argument("--culprit", type=int, default=1)
    p.add_argument("--slow-factor", type=float, default=1.0)
    p.add_argument("--slow-from-step", type=int, default=0)
    p.add_argument("--pause-every", type=int, default=0)
    p.add_argument("--pause-s", type=float, default=0.0)
    p.add_argument("--pause-max-s", type=float, default=0.0)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-steps", type=int, default=0)
    p.add_argument("--lone-every", type=int, default=0)
    p.add_argument("--lone-s", type=float, default=0.0)
    p.add_argument("--hang-step", type=int, default=-1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pattern", choices=("all_reduce", "monitored_barrier", "pipeline"), default="all_reduce")
    p.add_argument("--max-lifetime", type=float, default=3600.0)
    return p.parse_args()


def mark(out: Path, rank: int, phase: str) -> None:
    tmp = out / f".phase-{rank}"
    tmp.write_text(f"{phase} {time.time_ns()}")
    tmp.replace(out / f"phase-{rank}")


def stuck_in_python(out: Path, rank: int) -> None:
    (out / f"hang-{rank}").write_text(str(time.time_ns()))
    while True:
        time.sleep(1.0)


class Pipeline:
    """One GPipe stage per rank (torch.distributed.pipelining): each stage's forward sleeps the step's
    compute split over its microbatches; the culprit's forward stops in `stuck_in_python` at its hang
    step, and the stages after it wait to receive from it."""

    MICROBATCHES = 2

    def __init__(self, out: Path, rank: int, world: int) -> None:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        self.rank, self.world = rank, world
        self.module = _Stage(out, rank)
        # Shapes given (no metadata exchange at the first step: it pickles objects, which needs numpy).
        shape = torch.empty(2, 8)
        stage = PipelineStage(self.module, rank, world, torch.device("cpu"), input_args=(shape,), output_args=shape)
        # No loss: forward only (an inference pipeline); the stages still wait on each other in p2p.
        self.schedule = ScheduleGPipe(stage, n_microbatches=self.MICROBATCHES)

    def step(self, compute_s: float, hang: bool) -> None:
        self.module.compute_s, self.module.hang = compute_s / self.MICROBATCHES, hang
        x = torch.ones(2 * self.MICROBATCHES, 8)
        if self.rank == 0:
            self.schedule.step(x)
        elif self.rank == self.world - 1:
            self.schedule.step()
        else:
            self.schedule.step()


class _Stage(torch.nn.Module):
    def __init__(self, out: Path, rank: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.out, self.rank = out, rank
        self.compute_s, self.hang = 0.0, False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hang:
            stuck_in_python(self.out, self.rank)
        time.sleep(self.compute_s)
        out: torch.Tensor = self.linear(x)
        return out


def main() -> int:
    args = parse()
    deadline = time.monotonic() + args.max_lifetime
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.max_lifetime))
    rank = dist.get_rank()
    rng = random.Random(args.seed * 1000 + rank)
    shared = random.Random(args.seed)  # the same draws on every rank
    grads = torch.ones(64)
    pipeline = Pipeline(args.out, rank, dist.get_world_size()) if args.pattern == "pipeline" else None
    for step in range(args.steps):
        if time.monotonic() > deadline:
            os._exit(3)
        if args.pause_every and step and step % args.pause_every == 0:
            mark(args.out, rank, "pause")
            time.sleep(shared.uniform(args.pause_s, max(args.pause_s, args.pause_max_s)))
        if args.eval_every and step and step % args.eval_every == 0:
            mark(args.out, rank, "eval")
            for _eval in range(args.eval_steps):
                time.sleep(args.step_s / 2)
                dist.all_reduce(grads)
        if args.lone_every and step and step % args.lone_every == 0 and rank == 0:
            mark(args.out, rank, "lone")
            time.sleep(args.lone_s)
        mark(args.out, rank, f"step {step}")
        compute = args.step_s + rng.uniform(0.0, args.jitter_s)
        if rank == args.culprit and step >= args.slow_from_step and args.slow_factor != 1.0:
            if step == args.slow_from_step:
                (args.out / f"slow-{rank}").write_text(str(time.time_ns()))
            compute *= args.slow_factor
        hang = step == args.hang_step and rank == args.culprit
        if args.pattern == "pipeline":
            assert pipeline is not None
            pipeline.step(compute, hang)
            dist.all_reduce(grads)  # the loss, averaged
            continue
        if args.pattern == "monitored_barrier":
            for _layer in range(args.layers):
                dist.all_reduce(grads)
        if hang:
            time.sleep(rng.uniform(0.0, compute))
            stuck_in_python(args.out, rank)
        time.sleep(compute)
        if args.pattern == "monitored_barrier":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=args.max_lifetime), wait_all_ranks=True)
            continue
        for _layer in range(args.layers):
            dist.all_reduce(grads)
    (args.out / f"done-{rank}").write_text(str(time.time_ns()))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
