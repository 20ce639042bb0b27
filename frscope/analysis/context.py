"""Shared inputs of the per-group checks: options, the dumps, and how to describe a rank."""

from __future__ import annotations

from dataclasses import dataclass, field

from frscope.analysis.clock import Clock, build_clock
from frscope.analysis.findings import Finding, RankView
from frscope.analysis.stacks import blocked_in, describe, main_stack, user_frame
from frscope.analysis.tracks import Track, blocked_entry
from frscope.analysis.waitfor import WaitGraph
from frscope.records import DumpSet, Entry, Frame

DEFAULT_STALL_AFTER_S = 10.0
DEFAULT_CLOCK_SKEW_MS = 20.0


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    # A collective in flight for less than this is treated as still running, not hung. Dumps written
    # by torch on timeout are far older than this; a healthy job's in-flight ops are far younger.
    stall_after_s: float = DEFAULT_STALL_AFTER_S
    # Creation times of different hosts differ by clock skew; lateness below this is not a straggler.
    clock_skew_ms: float = DEFAULT_CLOCK_SKEW_MS
    # 'Now' for ages, in ns since the epoch. Default: the time the recorders were captured.
    now_ns: int | None = None
    # Cap on per-rank details kept in a finding (1,024 culprits must not make a 1,024-row report).
    max_rank_views: int = 16


# How a collector says a rank did not answer (frscope's sidecar: "<socket>: no answer within 5 s").
_NO_ANSWER = ("no answer", "timed out", "did not answer")
# How a collector says a rank's process is gone (the sidecar: "<socket>: socket is gone", "cannot
# connect: Connection refused"; the demo launcher: "process exited with code N").
_GONE = ("socket is gone", "cannot connect", "connection refused", "process exited", " is gone")


def gone_ranks(dumpset: DumpSet) -> frozenset[int]:
    """Ranks whose collector says their process is gone (its worker socket went with it)."""
    return frozenset(p.rank for p in dumpset.problems
                     if p.rank is not None and any(w in p.message.lower() for w in _GONE))


@dataclass(slots=True)
class Context:
    dumpset: DumpSet
    tracks: dict[str, dict[int, Track]]
    options: AnalysisOptions
    _stacks: dict[int, tuple[Frame, ...]] = field(default_factory=dict)
    clock: Clock = field(init=False)
    waits: WaitGraph = field(init=False)  # the wait-for model: every rank's state and whom it waits on

    def __post_init__(self) -> None:
        self.clock = build_clock(self.dumpset, self.tracks, self.options.now_ns)
        self.waits = WaitGraph(self.dumpset, self.tracks, self.live_stack)

    def gone_ranks(self) -> frozenset[int]:
        """Ranks whose collector says their process is gone (its worker socket went with it)."""
        return gone_ranks(self.dumpset)

    def unresponsive_ranks(self) -> frozenset[int]:
        """Ranks whose worker server gave no answer (alive, but holding the GIL or in native code)."""
        return frozenset(p.rank for p in self.dumpset.problems
                         if p.rank is not None and any(w in p.message.lower() for w in _NO_ANSWER))

    def now_for(self, ranks: list[int]) -> int | None:
        """When the recorders of `ranks` were read (the latest of them); see `clock`."""
        return self.clock.now_for(ranks)[0]

    def age_source(self, ranks: list[int]) -> str | None:
        """Where `now_for(ranks)` came from, in words for the report."""
        return self.clock.describe(self.clock.now_for(ranks)[1])

    def live_stack(self, rank: int) -> tuple[Frame, ...]:
        cached = self._stacks.get(rank)
        if cached is not None:
            return cached
        dump = self.dumpset.dumps.get(rank)
        frames: tuple[Frame, ...] = ()
        if dump is not None and dump.stacks:
            thread = dump.entries[-1].thread_id if dump.entries else None
            frames = main_stack(dump.stacks, thread)
        self._stacks[rank] = frames
        return frames

    def in_python(self, rank: int) -> bool:
        """The rank has a live stack (taken at the capture) and it is in no torch.distributed call: it waits
        on nobody."""
        stack = self.live_stack(rank)
        return bool(stack) and blocked_in(stack) is None

    def activity(self, rank: int) -> str | None:
        """What the rank is doing now: its live stack if one was captured, else the recorder's view."""
        described = describe(self.live_stack(rank))
        if described:
            return described
        dump = self.dumpset.dumps.get(rank)
        if dump is None:
            return "no dump"
        stuck = blocked_entry(dump.entries)
        if stuck is not None:
            return f"blocked in {stuck.op} #{_seq(stuck)} of group {stuck.pg_name} ({stuck.state})"
        if dump.entries:
            last = dump.entries[-1]
            return f"idle since {last.op} #{_seq(last)} of group {last.pg_name} completed"
        return "recorder empty"

    def show_culprit(self, finding: Finding, rank: int, group: str, entry: Entry | None) -> None:
        """A culprit's view in `finding`: where it stands in `group`, the call site of `entry` (its own
        op there, if any) and its live stack, where those exist."""
        finding.ranks[rank] = self.rank_view(rank, group, entry)
        if entry is not None and entry.frames:
            finding.culprit_frames[rank] = entry.frames
        stack = self.live_stack(rank)
        if stack:
            finding.culprit_stacks[rank] = stack

    def rank_view(self, rank: int, group: str, entry: Entry | None, *, call_site: bool = True) -> RankView:
        """`call_site` reads the entry's frames (from the file, for lazily loaded dumps): culprits only."""
        track = self.tracks.get(group, {}).get(rank)
        view = RankView(
            rank=rank,
            last_enqueued_seq=track.last_seq if track else None,
            last_completed_seq=track.last_completed if track else None,
            activity=self.activity(rank),
        )
        if entry is not None:
            view.op = entry.op
            view.state = entry.state + (" (retired)" if entry.retired else "")
            view.input_sizes = entry.input_sizes
            view.output_sizes = entry.output_sizes
            view.input_dtypes = entry.input_dtypes
            view.output_dtypes = entry.output_dtypes
            view.time_created_ns = entry.time_created_ns
            view.duration_ms = entry.duration_ms
            if call_site:
                view.call_site = user_frame(entry.frames)
        return view


def _seq(entry: Entry) -> int:
    return entry.p2p_seq_id if entry.is_p2p else entry.collective_seq_id
