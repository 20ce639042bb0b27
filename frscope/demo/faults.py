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
