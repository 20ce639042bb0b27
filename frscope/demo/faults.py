"""The demo job's faults: what each one does, which rank causes it, how the launcher collects it.

Shared by the job (which injects the fault) and the launcher, tests and fixture script (which need
to know what to expect). No torch here: the launcher and the CLI import this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Every job runs these many training steps; the fault strikes at FAULT_STEP (0-based). Steps are
# all_reduces on the default group, so the fault step's all_reduce has collective_seq_id
# FAULT_STEP + 1 there.
STEPS = 6
FAULT_STEP = 3
STRAGGLER_STEPS = 20
STRAGGLER_DELAY_S = 0.15
# "steps" and "jitter": longer steps of several collectives each (a model's layers), so that
# lateness at a step's first collective is diluted over the rest of the step.
LAYER_STEPS = 8
LAYERS = 4
STEP_LATE_S = 0.4  # "steps": the culprit's data loader takes this much longer before every step
JITTER_MAX_S = 0.25  # "jitter": every rank's loader takes a random 0..this before every step
CRASH_STEP_S = 0.3  # "crash": every step takes this long, so the culprit's early dump is visibly older


@dataclass(frozen=True)
class Fault:
    name: str
    # The ranks that misbehave, before clamping to the world size (empty: nobody does).
    culprits: tuple[int, ...]
    # "settle": the job ends hung or idle, collect once the recorders stop changing.
    # "poll": ranks die; poll every rank and keep the last good snapshot of each.
    collect: Literal["settle", "poll"]
    min_world_size: int
    summary: str


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("none", (), "settle", 2, "healthy: every rank finishes its steps, then idles"),
        Fault("hang", (1,), "settle", 2,
              "the culprit is stuck in load_batch before the fault step's all_reduce; the others wait in it"),
        Fault("skip", (1,), "settle", 2,
              "the culprit skips the fault step's all_reduce, finishes a step early and idles in "
              "save_checkpoint; the others wait in their last all_reduce"),
        Fault("type", (1,), "settle", 2,
              "the culprit calls broadcast where the others call all_reduce: every rank hangs"),
        Fault("size", (1,), "settle", 2,
              "the culprit passes a [4, 8] tensor where the others pass [8, 4]: same bytes, gloo "
              "completes silently with wrong data; then every rank idles"),
        Fault("dtype", (1,), "settle", 2,
              "the culprit passes int32 where the others pass float32: same bytes, gloo completes "
              "silently with wrong data; then every rank idles"),
        Fault("p2p", (0, 1), "settle", 2,
              "ranks 0 and 1 both recv from each other first (unrecorded by gloo); the other ranks "
              "wait in the fault step's all_reduce"),
        Fault("straggler", (2,), "settle", 2,
              "the culprit sleeps 150 ms before every all_reduce for 20 steps; then every rank idles"),
        Fault("steps", (2,), "settle", 2,
              f"the culprit's data loader takes {STEP_LATE_S:g} s longer before each of {LAYER_STEPS} steps "
              f"of {LAYERS} all_reduces: late at every step's first collective, in lockstep after it"),
        Fault("jitter", (), "settle", 2,
              f"healthy but uneven: every rank's data loader takes a random 0-{JITTER_MAX_S:g} s before each "
              "step (no rank is late more often than the others)"),
        Fault("crossgroup", (1,), "settle", 2,
              "every step all_reduces on the param_sync subgroup, then on the default group; the culprit "
              "skips the subgroup's all_reduce at the fault step and waits in the default group's"),
        Fault("pipeline", (1,), "settle", 4,
              "at the fault step every rank passes a tensor down a pipeline (recv from the previous rank, send "
              "to the next); the culprit is stuck in its data loader before its recv, so the ranks after it "
              "wait in recv, one behind the other"),
        Fault("crash", (2,), "poll", 3,
              "the culprit writes an early recorder dump after step 0 (a periodic dump), then is killed "
              "(SIGKILL) at the fault step; the survivors' all_reduce fails and each writes its recorder "
              "as it fails, then exits 1"),
        Fault("size-bytes", (2,), "poll", 3,
              "the culprit passes twice the bytes to an all_reduce: the rank receiving from it "
              "aborts with no dump, the others fail with 'Connection reset by peer'"),
    )
}

# What `frscope demo --fault` offers: the faults that end with every rank alive and answering.
DEMO_FAULTS = tuple(name for name, f in FAULTS.items() if f.collect == "settle")


def culprit_ranks(fault: str, world_size: int) -> tuple[int, ...]:
    """The ranks that misbehave in `fault` for a job of `world_size` ranks."""
    return tuple(sorted({min(rank, world_size - 1) for rank in FAULTS[fault].culprits}))


def subgroup_ranks(world_size: int) -> list[int]:
    """The ranks of the job's second process group: the first half, at least two."""
    return list(range(max(2, (world_size + 1) // 2)))
