"""Per (rank, process group) progress and stall tracking.

Progress uses the analysis' notion (frscope.analysis.tracks): per group, the highest
`collective_seq_id` enqueued and the first one not completed (gloo: not `retired`). A group is *in
flight* when it has an entry that is not completed; it is *stalled* when it is in flight and its
progress has not changed for the stall threshold: `--stall-after`, capped at a fraction of the
in-flight entry's `timeout_ms`. Before that it is *suspected*: in flight with no progress for longer
than its own rhythm allows (frscope.sidecar.rhythm: 3 x its usual wait, within `--suspect-min` and
`--suspect-after`, and never later than the stall threshold). A suspicion ends when the group makes
progress (`resumed`) or becomes a stall (`confirmed`).

When does a group last make progress? The recorder dates enqueues (`time_created_ns`) and, with
NCCL timing, completions (`time_discovered_completed_ns`); gloo dates no completion. When a poll
sees progress change, the newest of those times dates it if it falls after the previous poll,
otherwise the poll that saw it does. The first time a group is seen with a collective in flight,
the newest of those times dates its last progress (a collective enqueued after every earlier one
completed, as synchronous code does). A stall is therefore flagged at the first poll after the
threshold has passed since the hung collective was enqueued: within `--stall-after` + one poll
interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from frscope.analysis.tracks import build_tracks
from frscope.records import DumpSet, Entry, RankDump
from frscope.sidecar.rhythm import Rhythm

ARRIVALS_KEPT = 256  # at least wire.STATUS_ARRIVALS

# How a suspicion ended: the label values of frscope_suspected_stalls_total{outcome}.
SUSPICION_OUTCOMES = ("resumed", "confirmed")


@dataclass(frozen=True, slots=True)
class GroupSample:
    """One group as one rank's recorder shows it at one poll."""

    pg: str
    desc: str
    last_enqueued_seq: int | None
    last_completed_seq: int | None
    p2p_enqueued: int
    p2p_completed: int
    inflight_op: str | None
    inflight_seq: int | None
    inflight_created_ns: int | None
    inflight_timeout_ms: int | None
    # The newest enqueue or (where the recorder dates them) completion time of the group's entries.
    newest_progress_ns: int | None
    # (collective_seq_id, enqueue time) of its newest ARRIVALS_KEPT collectives: the rank's arrivals,
    # compared across ranks for lateness (frscope.analysis.lateness).
    arrivals: tuple[tuple[int, int], ...] = ()
    # (collective_seq_id, wait in ns) of those the recorder dates (NCCL with timing: `duration_ms`, the
    # wait for the last peer plus the transfer), for the operator's skew-free comparison across pods.
    waits: tuple[tuple[int, int], ...] = ()

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (self.last_enqueued_seq or 0, self.last_completed_seq or 0, self.p2p_enqueued, self.p2p_completed)

    @property
    def inflight(self) -> bool:
        return self.inflight_op is not None


def without_inflight(samples: dict[str, GroupSample]) -> dict[str, GroupSample]:
    """The samples with nothing in flight (a probe showed the rank idle or moving on)."""
    return {
        pg: s if not s.inflight else replace(s, inflight_op=None, inflight_seq=None, inflight_created_ns=None,
                                             inflight_timeout_ms=None)
        for pg, s in samples.items()
    }


def sample_groups(dump: RankDump) -> dict[str, GroupSample]:
    """Progress of every group in one rank's recorder (one pass, via the analysis' tracks)."""
    tracks = build_tracks(DumpSet(dumps={dump.rank: dump}, groups={}, world_size=dump.rank + 1))
    out: dict[str, GroupSample] = {}
    for pg, by_rank in tracks.items():
        track = by_rank[dump.rank]
        open_entry: Entry | None = None
        if track.by_seq and track.next_seq <= track.last_seq:
            bucket = track.by_seq.get(track.next_seq)
            if bucket:
                open_entry = bucket[0]
        p2p_enq = 0
        p2p_done = 0
        for entry in track.p2p:
            p2p_enq = max(p2p_enq, entry.p2p_seq_id)
            if entry.completed:
                p2p_done = max(p2p_done, entry.p2p_seq_id)
            elif open_entry is None or entry.record_id < open_entry.record_id:
                open_entry = entry
        newest = 0
        desc = ""
        groups_entries: list[Sequence[Entry]] = [*track.by_seq.values(), track.p2p]
        for entries in groups_entries:
            for entry in entries:
                desc = desc or entry.pg_desc
                created = entry.time_created_ns or 0
                done = entry.time_completed_ns or 0
                newest = max(newest, created, done)
        out[pg] = GroupSample(
            pg=pg,
            desc=desc,
            last_enqueued_seq=track.last_seq or None,
            last_completed_seq=track.last_completed if track.by_seq else None,
            p2p_enqueued=p2p_enq,
            p2p_completed=p2p_done,
            inflight_op=open_entry.op if open_entry is not None else None,
            inflight_seq=(
                (open_entry.p2p_seq_id if open_entry.is_p2p else open_entry.collective_seq_id)
                if open_entry is not None
                else None
            ),
            inflight_created_ns=open_entry.time_created_ns if open_entry is not None else None,
            inflight_timeout_ms=open_entry.timeout_ms if open_entry is not None else None,
            newest_progress_ns=newest or None,
            arrivals=_arrivals(track.by_seq),
            waits=_waits(track.by_seq),
        )
    return out


def _arrivals(by_seq: Mapping[int, list[Entry]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for seq in sorted(by_seq)[-ARRIVALS_KEPT:]:
        created = by_seq[seq][0].time_created_ns if by_seq[seq] else None
        if created:
            out.append((seq, created))
    return tuple(out)


def _waits(by_seq: Mapping[int, list[Entry]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for seq in sorted(by_seq)[-ARRIVALS_KEPT:]:
        duration = next((e.duration_ms for e in by_seq[seq] if e.duration_ms is not None), None)
        if duration is not None and duration >= 0:
            out.append((seq, int(duration * 1e6)))
    return tuple(out)


@dataclass(slots=True)
class GroupState:
    rank: int
    sample: GroupSample
    progress_ns: int  # best estimate of when this group last made progress (wall clock)
    first_inflight_ns: int | None  # when the sidecar first saw the current in-flight op
    threshold_s: float
    stalled: bool = False
    stalled_since_ns: int | None = None
    stall_count: int = 0
    rhythm: Rhythm = field(default_factory=Rhythm)
    suspect_threshold_s: float = 0.0
    # Suspected: in flight and quiet past suspect_threshold_s; stays so once confirmed, until progress.
    suspected: bool = False
    suspected_since_ns: int | None = None

    def inflight_age_s(self, now_ns: int) -> float | None:
        if not self.sample.inflight:
            return None
        since = self.sample.inflight_created_ns or self.first_inflight_ns
        if since is None:
            return None
        return max(0.0, (now_ns - since) / 1e9)


@dataclass(frozen=True, slots=True)
class SuspicionEnd:
    """A suspicion that ended at a poll: how, and how long after it was raised."""

    group: GroupState
    outcome: str  # one of SUSPICION_OUTCOMES
    after_s: float  # seconds from the suspicion to its end
    quiet_s: float  # how long the group had been quiet when it ended


@dataclass(slots=True)
class StallTracker:
    stall_after_s: float
    timeout_fraction: float
    # Suspicion (rhythm.py): never sooner than suspect_min_s, at the latest suspect_after_s; 0: off.
    suspect_after_s: float = 0.0
    suspect_min_s: float = 0.0
    groups: dict[tuple[int, str], GroupState] = field(default_factory=dict)
    # What the updates since the last `drain` raised and ended (the poller reports them).
    raised: list[GroupState] = field(default_factory=list)
    ended: list[SuspicionEnd] = field(default_factory=list)

    def threshold(self, sample: GroupSample) -> float:
        limit = self.stall_after_s
        if sample.inflight_timeout_ms:
            limit = min(limit, self.timeout_fraction * sample.inflight_timeout_ms / 1000.0)
        return limit

    def suspect_threshold(self, state: GroupState) -> float:
        if self.suspect_after_s <= 0:
            return state.threshold_s
        return min(state.threshold_s, state.rhythm.threshold_s(self.suspect_min_s, self.suspect_after_s))

    def update(
        self, rank: int, samples: dict[str, GroupSample], now_ns: int, previous_poll_ns: int | None,
        *, moved: bool = False, changed_by_ns: int | None = None,
    ) -> list[GroupState]:
        """Fold one poll of one rank in; returns the groups that became stalled at this poll (the
        suspicions raised and ended are kept for `drain`).

        `moved`: the rank's cheap progress probe changed since the previous poll although `samples`
        are the last full recorder's (see app.py): every group counts as progressing now.
        `changed_by_ns`: the first probe that showed the rank's current progress; a change of key
        that the recorder cannot date happened by then (default: now)."""
        newly: list[GroupState] = []
        for pg, sample in samples.items():
            state = self.groups.get((rank, pg))
            dated = sample.newest_progress_ns
            progressed = False
            if state is None:
                progress_ns = now_ns
                if sample.inflight and dated is not None:
                    progress_ns = min(dated, now_ns)
                state = GroupState(rank, sample, progress_ns, now_ns if sample.inflight else None,
                                   self.threshold(sample))
                self.groups[(rank, pg)] = state
            else:
                old = state.sample
                if moved:
                    state.progress_ns = now_ns
                    progressed = True
                elif sample.key != old.key:
                    state.progress_ns = min(changed_by_ns, now_ns) if changed_by_ns is not None else now_ns
                    if dated is not None and previous_poll_ns is not None and previous_poll_ns < dated <= now_ns:
                        state.progress_ns = dated
                    progressed = True
                if sample.inflight and (not old.inflight or sample.inflight_seq != old.inflight_seq
                                        or sample.inflight_op != old.inflight_op):
                    state.first_inflight_ns = now_ns
                elif not sample.inflight:
                    state.first_inflight_ns = None
                state.sample = sample
                state.threshold_s = self.threshold(sample)
            quiet_s = (now_ns - state.progress_ns) / 1e9
            if progressed or not sample.inflight:
                state.rhythm.resolve()
            if sample.inflight and not progressed:
                state.rhythm.observe(quiet_s)
            state.suspect_threshold_s = self.suspect_threshold(state)
            stalled = sample.inflight and quiet_s >= state.threshold_s
            suspected = stalled or (sample.inflight and quiet_s >= state.suspect_threshold_s)
            if suspected and not state.suspected:
                state.suspected_since_ns = now_ns
                self.raised.append(state)
            elif state.suspected and not suspected and not state.stalled:
                self._end(state, "resumed", now_ns, quiet_s)
            if stalled and not state.stalled:
                self._end(state, "confirmed", now_ns, quiet_s)
                state.stalled_since_ns = now_ns
                state.stall_count += 1
                newly.append(state)
            elif not stalled:
                state.stalled_since_ns = None
            state.stalled = stalled
            state.suspected = suspected
            if not suspected:
                state.suspected_since_ns = None
        return newly

    def _end(self, state: GroupState, outcome: str, now_ns: int, quiet_s: float) -> None:
        since = state.suspected_since_ns if state.suspected_since_ns is not None else now_ns
        self.ended.append(SuspicionEnd(state, outcome, (now_ns - since) / 1e9, quiet_s))

    def drain(self) -> tuple[list[GroupState], list[SuspicionEnd]]:
        """The suspicions raised and ended since the last call (a stall raised and confirmed at the same
        poll is in both: raised, and ended as confirmed)."""
        raised, ended = self.raised, self.ended
        self.raised, self.ended = [], []
        return raised, ended

    @property
    def suspected(self) -> list[GroupState]:
        return [s for s in self.groups.values() if s.suspected]

    def for_rank(self, rank: int) -> dict[str, GroupState]:
        return {pg: s for (r, pg), s in self.groups.items() if r == rank}

    def forget_rank(self, rank: int) -> None:
        for key in [k for k in self.groups if k[0] == rank]:
            del self.groups[key]

    @property
    def stalled(self) -> list[GroupState]:
        return [s for s in self.groups.values() if s.stalled]
