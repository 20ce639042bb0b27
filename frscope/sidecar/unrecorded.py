"""Hangs the recorder cannot see (docs/sidecar.md, "Hangs the recorder cannot see"; issue 33,
principle 6).

On gloo, `send`/`recv` (torch.distributed.pipelining) and `monitored_barrier` leave no recorder
entry: when one rank stops in Python, the ranks waiting for it in such a call look idle to their
recorders, with every entry retired, and the stall tracker (progress.py), which watches collectives
in flight, never fires. What does show it is their live stacks.

The watch: when no group of any of the pod's live ranks has had anything in flight or made progress
for longer than the job's usual step (3 x the usual gap between consecutive collectives' enqueue
times, within `--suspect-min` and `--suspect-after`, never longer than `--stall-after`), each rank's
stack is asked once (`dump_traceback`). A rank whose main thread (`rank_wait`) sits in a
torch.distributed call (frscope.analysis.stacks.blocked_in: a `distributed_c10d` function such as
`recv` or `monitored_barrier`, or pipelining's wait on its batched p2p, read as `batch_isend_irecv`)
is a candidate; when the next round's stacks show it in the very same frames (no race with a
collective just starting, no healthy wait caught twice by chance), the hang is suspected, captured
with the stacks and pushed, as a stall's suspicion is. While suspected the stacks are asked every
round: the suspicion resumes when the recorder moves again or no rank waits in the same place any
more, and is confirmed (a stall) once the quiet time reaches `--stall-after`. Where no rank waits in
torch.distributed (an evaluation, a checkpoint, a data loader: all in Python), the stacks are asked
again after twice the quiet time so far, at most every `--stall-after`: a long healthy pause costs a
handful of tracebacks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from frscope.analysis.stacks import blocked_in, main_stack, parse_traceback, user_frame
from frscope.records import Frame
from frscope.sidecar.rhythm import RHYTHM_FACTOR

if TYPE_CHECKING:
    from frscope.sidecar.poller import Poller

log = logging.getLogger("frscope.sidecar")

# Gaps between enqueues kept per rank to learn the usual step, and the share of them it covers.
STEP_GAPS_KEPT = 256
STEP_QUANTILE = 0.9


@dataclass(frozen=True, slots=True)
class RankWait:
    """A rank whose main thread sits in a torch.distributed call its recorder does not show."""

    rank: int
    op: str  # the function: recv, monitored_barrier, batch_isend_irecv (pipelining)...
    site: str  # where the user's code called it: "train.py:31 (step)"; "" if no frame is the user's
    frames: tuple[Frame, ...]


def usual_step_s(enqueues: dict[int, list[int]]) -> float:
    """The job's usual step: the STEP_QUANTILE quantile of the gaps between consecutive distinct
    enqueue times (ns) of each rank's collectives, all groups together; 0 with fewer than two."""
    gaps: list[int] = []
    for times in enqueues.values():
        ordered = sorted(set(times))[-(STEP_GAPS_KEPT + 1):]
        gaps.extend(b - a for a, b in zip(ordered, ordered[1:], strict=False))
    if not gaps:
        return 0.0
    gaps.sort()
    return gaps[min(len(gaps) - 1, int(STEP_QUANTILE * len(gaps)))] / 1e9


def rank_wait(rank: int, stacks: str | None) -> RankWait | None:
    """Where the rank waits in torch.distributed, from its `dump_traceback` text: the thread that issues
    collectives is not marked there, so the deepest stack is read (the analysis' choice without a
    recorder thread id), and where it does not wait, a thread that does (a data loader's pin-memory
    thread may be deeper than a main thread blocked in `monitored_barrier`)."""
    frames = main_stack(stacks or "")
    op = blocked_in(frames)
    if op is None:
        for thread in parse_traceback(stacks or ""):
            op = blocked_in(thread.frames)
            if op is not None:
                frames = thread.frames
                break
    if op is None:
        return None
    user = user_frame(frames)
    site = f"{user.filename}:{user.line} ({user.name})" if user is not None and user is not frames[0] else ""
    return RankWait(rank, op, site, frames)


@dataclass(slots=True)
class UnrecordedWatch:
    suspect_min_s: float
    suspect_after_s: float  # 0: suspicions off (the threshold is --stall-after)
    stall_after_s: float
    poll_interval_s: float
    quiet_since_ns: int | None = None  # the pod's last recorder progress, while nothing is in flight
    first_seen_ns: int | None = None  # the first round with a live rank (dates a recorder never written)
    next_ask_ns: int = 0
    usual_step_s: float = 0.0
    threshold_s: float = 0.0
    waits: dict[int, RankWait] = field(default_factory=dict)  # the latest stacks' waits
    blocked: dict[int, RankWait] = field(default_factory=dict)  # waits seen the same at two rounds running
    suspected_since_ns: int | None = None
    stalled_since_ns: int | None = None
    asked: int = 0  # stack samples taken (for the tests and the log)

    @property
    def suspected(self) -> bool:
        return self.suspected_since_ns is not None

    @property
    def stalled(self) -> bool:
        return self.stalled_since_ns is not None

    def quiet_s(self, now_ns: int) -> float:
        return 0.0 if self.quiet_since_ns is None else max(0.0, (now_ns - self.quiet_since_ns) / 1e9)

    def threshold(self, usual_s: float) -> float:
        upper = min(self.suspect_after_s, self.stall_after_s) if self.suspect_after_s > 0 else self.stall_after_s
        return min(upper, max(self.suspect_min_s, RHYTHM_FACTOR * usual_s))

    def _quiet_since(self, poller: Poller, now_ns: int) -> int | None:
        """When the pod's recorders last moved, if every group of every live rank is idle (nothing in
        flight, nothing suspected by the stall tracker); None otherwise (the tracker's business)."""
        up = [rank for rank, state in poller.ranks.items() if state.up]
        if not up:
            return None
        if self.first_seen_ns is None:
            self.first_seen_ns = now_ns
        newest = self.first_seen_ns
        for rank in up:
            for group in poller.tracker.for_rank(rank).values():
                if group.sample.inflight or group.suspected:
                    return None
                newest = max(newest, group.progress_ns)
        return newest

    def _learn(self, poller: Poller) -> None:
        enqueues = {
            rank: [ns for group in poller.tracker.for_rank(rank).values() for _seq, ns in group.sample.arrivals]
            for rank, state in poller.ranks.items() if state.up
        }
        self.usual_step_s = usual_step_s(enqueues)
        self.threshold_s = self.threshold(self.usual_step_s)

    async def round(self, poller: Poller, now_ns: int) -> str | None:
        """After a poll round: 'suspect' (a hang the recorder cannot see, suspected now), 'stall' (one
        confirmed now), 'resumed' (a suspicion ended: the recorder or the stacks moved on), or None."""
        since = self._quiet_since(poller, now_ns)
        if since is None or (self.quiet_since_ns is not None and since != self.quiet_since_ns):
            ended = self._end("the recorders moved on") if self.suspected else None
            self.quiet_since_ns, self.next_ask_ns, self.waits, self.blocked = since, 0, {}, {}
            return ended
        self.quiet_since_ns = since
        self._learn(poller)
        quiet_s = self.quiet_s(now_ns)
        if quiet_s < self.threshold_s or now_ns < self.next_ask_ns:
            return None
        await poller.fetch_stacks()
        self.asked += 1
        waits = {rank: found for rank, state in sorted(poller.ranks.items())
                 if state.up and (found := rank_wait(rank, state.stacks)) is not None}
        same = {rank: w for rank, w in waits.items() if rank in self.waits and self.waits[rank].frames == w.frames}
        self.waits, self.blocked = waits, same
        if not same:
            # Nobody waits (a pause in Python: ask again after twice the quiet time, at most every
            # --stall-after), or a wait seen once: the next round says whether it holds.
            backoff = self.poll_interval_s / 2 if waits else min(max(quiet_s, self.threshold_s), self.stall_after_s)
            self.next_ask_ns = now_ns + int(backoff * 1e9)
            return self._end("no rank waits where it did") if self.suspected else None
        self.next_ask_ns = now_ns + int(self.poll_interval_s / 2 * 1e9)  # every round while it holds
        event = None
        if not self.suspected:
            self.suspected_since_ns = now_ns
            event = "suspect"
            log.warning("suspected hang the recorder cannot see: no recorder progress for %.1f s (the usual step "
                        "%.2f s, suspected after %.1f s) while %s", quiet_s, self.usual_step_s, self.threshold_s,
                        self.describe())
        if quiet_s >= self.stall_after_s and not self.stalled:
            self.stalled_since_ns = now_ns
            event = "stall"
            log.warning("stall the recorder cannot see: no recorder progress for %.1f s while %s", quiet_s,
                        self.describe())
        return event

    def _end(self, why: str) -> str | None:
        """The suspicion is over: 'resumed' before it was confirmed (a confirmed stall that moves on
        ends as stalls do, with no outcome of its own)."""
        outcome = None if self.stalled else "resumed"
        log.info("%s the recorder cannot see is over: %s", "stall" if self.stalled else "suspected hang", why)
        self.suspected_since_ns = self.stalled_since_ns = None
        self.blocked = {}
        return outcome

    def describe(self) -> str:
        """'rank 0 waits in recv (train.py:31 (step)), rank 2 in monitored_barrier'."""
        parts = [f"rank {w.rank} waits in {w.op}" + (f" ({w.site})" if w.site else "") for w in self.blocked.values()]
        return ", ".join(parts[:8]) + (f" and {len(parts) - 8} more" if len(parts) > 8 else "")
