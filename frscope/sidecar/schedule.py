"""When the sidecar polls: on the wall clock's slots, the same slots in every pod of a job.

A full recorder read (`fr_trace_json`) costs the rank tens of milliseconds: torch serializes the
whole recorder inside the process, on CPU the training step also wants (bench/RESULTS.md, "Full
reads at scale"). A synchronous job moves at its slowest rank's pace, so what matters is how many
steps contain a read on *some* rank. If each of 10,000 sidecars read its ranks once a minute at a
moment of its own, almost every step of the job would hold one, and the whole job would pay a read's
delay every step. Reading on slots of the wall clock instead (multiples of --poll-interval since the
epoch; the periodic full read on every --full-poll-every-th slot) puts every rank's read of a period
into the same moment: the job pays one read's delay a period. Nodes' clocks agree within
milliseconds (NTP), far below the seconds between slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PollSlot:
    index: int  # the slot's number since the epoch: its time is index x interval
    wait_s: float  # seconds from now until it
    periodic: bool  # the slot of the periodic full read


def next_slot(now_s: float, interval_s: float, full_every: int) -> PollSlot:
    """The first slot strictly after `now_s` (a round that overran its slot skips to the next one)."""
    index = math.floor(now_s / interval_s) + 1
    return PollSlot(index, max(0.0, index * interval_s - now_s), index % max(1, full_every) == 0)
