"""When the sidecar polls: on the wall clock's slots, the same slots in every pod of a job.

A full recorder read (`fr_trace_json`) costs the rank tens of milliseconds: torch serializes the
whole recorder inside the process, on CPU the training step also wants (bench/RESULTS.md, "Sidecar
overhead"). A synchronous job moves at its slowest rank's pace, so what matters is how many steps
contain a read on *some* rank. If each of 10,000 sidecars read its ranks once a minute at a moment
of its own, almost every step of the job would hold one, and the whole job would pay a read's delay
every step. Reading on slots of the wall clock instead puts every rank's read of a period into the
same moment: the job pays one read's delay a period. Nodes' clocks agree within milliseconds (NTP),
far below the seconds between slots.

The slots of a job: `phase + k x --poll-interval` (k an integer), the periodic full read on the
slots where k is a multiple of --full-poll-every. The phase is drawn from the job's identity
(`--schedule-key`, which the operator's webhook sets to the pod's namespace and job name): every pod
of a job computes the same one, and two jobs sharing a node do not read in the same moment. Without
a key the phase is 0: every such sidecar reads on the multiples of the interval since the epoch,
which still aligns a job's pods.

What is not on the slots: the first read of a rank, and the reads a suspected stall triggers (a
probe that shows a collective in flight and no progress since the previous round): they happen in
the round that sees them, since that is when they matter and a stalled job has no steps to delay.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PollSlot:
    index: int  # the slot's number since the job's phase: its time is phase + index x interval
    wait_s: float  # seconds from now until it
    periodic: bool  # the slot of the periodic full read
    at_s: float  # its wall-clock time (seconds since the epoch)


def phase_s(key: str, interval_s: float, full_every: int) -> float:
    """The job's phase in [0, interval x full_every): the same for every pod given the same key,
    spread evenly over the period across keys. 0 without a key."""
    if not key:
        return 0.0
    fraction = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64
    return fraction * interval_s * max(1, full_every)


def next_slot(now_s: float, interval_s: float, full_every: int, phase: float = 0.0) -> PollSlot:
    """The first slot strictly after `now_s` (a round that overran its slot skips to the next one)."""
    index = math.floor((now_s - phase) / interval_s) + 1
    at = phase + index * interval_s
    if at <= now_s:  # (rounding, when now_s is just below a slot)
        index += 1
        at = phase + index * interval_s
    return PollSlot(index, max(0.0, at - now_s), index % max(1, full_every) == 0, at)
