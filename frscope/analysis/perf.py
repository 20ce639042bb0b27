"""Where the time goes in a job that is slow but not hung (`frscope analyze DIR --perf`).

Every collective that all of a group's ranks (with entries) recorded and completed is looked at once,
matched by `collective_seq_id`. Its time on each rank is split in two:

- **waiting for late peers** (the compute side: a peer was still computing, loading data, or stuck in
  Python): the rank was in the collective before the last rank arrived;
- **transfer** once every rank is there (the network side).

How the recorder allows that split:

- with durations (NCCL with `TORCH_NCCL_ENABLE_TIMING=1`, or start and completion times): a rank's
  duration covers its wait inside the collective plus the transfer. The rank that arrived last waited
  for nobody, so the shortest duration is the transfer, and each rank's wait is its duration minus it.
  No clocks are compared, so clock skew between hosts and NCCL's asynchronous enqueue do not matter;
- with creation times only (gloo): each rank's wait is the last creation time minus its own; the
  transfer is not recorded. Lateness under `clock_skew_ms` is not counted (a clock offset between hosts
  can look like it).

The rank that arrived last at a collective held up the others: the time it cost the job is the gap to
the next-latest rank (the collective would have finished that much sooner had it arrived with the
others). Summed over the collectives, that names the rank that costs the job the most.

Pure: no I/O; one pass over every rank's entries of every group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from math import isnan, prod
from operator import add, sub, truediv
from statistics import median

from frscope.analysis.context import DEFAULT_CLOCK_SKEW_MS
from frscope.analysis.ops import op_label
from frscope.analysis.tracks import Track, build_tracks
from frscope.records import DumpSet, Entry
from frscope.records.columns import EntryTable

# bytes per element of the recorder's dtype names (c10 ScalarType names)
DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}
# size buckets of a collective's input, by bytes (upper bounds)
SIZE_BUCKETS = ((1 << 10, "< 1 KiB"), (1 << 16, "1-64 KiB"), (1 << 20, "64 KiB-1 MiB"), (1 << 24, "1-16 MiB"),
                (1 << 28, "16-256 MiB"), (float("inf"), ">= 256 MiB"))
TOP_RANKS = 8
# a rank is named as the one that costs the job most only when it came last this often (one slow
# collective, a checkpoint or a log line, is not a pattern)
MIN_REPEATS = 3
MAX_BYTES = 1 << 62
_INF = float("inf")


@dataclass(slots=True)
class PerfRow:
    """One (group, op, size bucket): the time its collectives took."""

    group: str
    group_desc: str
    op_label: str
    size_bucket: str
    collectives: int = 0
    wait_ms: float = 0.0  # rank-milliseconds the ranks waited for late peers, summed over the ranks
    transfer_ms: float | None = None  # per collective, once all were there; summed (None: not recorded)
    bytes: int = 0  # input bytes per rank, summed over the collectives
    busiest_rank_wait_ms: float = 0.0  # the wait of the rank that waited most here
    _transfers: list[float] = field(default_factory=list)

    @property
    def bandwidth_gbps(self) -> float | None:
        """Input bytes per second of transfer (algorithm bandwidth, GB/s) where transfer times exist."""
        if not self.transfer_ms or not self.bytes or len(self._transfers) < self.collectives:
            return None
        return self.bytes / (self.transfer_ms / 1000.0) / 1e9


@dataclass(slots=True)
class RankCost:
    """What one rank cost the job by arriving last."""

    rank: int
    cost_ms: float = 0.0  # wall time: the gaps to the next-latest rank where it arrived last
    last_count: int = 0  # collectives it arrived last at (by more than the clock skew)
    waited_ms: float = 0.0  # its own time waiting for late peers
    collectives: int = 0  # collectives it took part in (counted)
    gaps: list[float] = field(default_factory=list)
    groups: dict[str, float] = field(default_factory=dict)  # group -> cost there

    @property
    def median_gap_ms(self) -> float | None:
        return median(self.gaps) if self.gaps else None


@dataclass(slots=True)
class PerfReport:
    timing: str  # "durations" | "creation times" | "none"
    window_ms: float  # from the first counted collective's creation to the last one's end
    ranks: int
    collectives: int  # (group, seq) pairs counted
    wait_ms: float  # rank-milliseconds waiting for late peers, all ranks
    transfer_ms: float | None  # wall milliseconds of transfer, summed over the collectives
    rank_time_ms: float  # sum over ranks of their active windows
    rows: list[PerfRow]  # largest wait + transfer first
    costs: list[RankCost]  # largest cost first (ranks that cost nothing are left out)
    clock_skew_ms: float
    headline: str = ""
    ranks_filtered: bool = False  # `costs` lists only the ranks asked about


def size_bucket(nbytes: int) -> str:
    return next(label for bound, label in SIZE_BUCKETS if nbytes < bound)


def entry_bytes(bucket: Sequence[Entry]) -> int:
    """Input bytes of one rank's entries at a seq id (coalesced: summed); 0 for an unknown dtype."""
    total = 0
    for e in bucket:
        for shape, dtype in zip(e.input_sizes, e.input_dtypes, strict=False):
            width = DTYPE_BYTES.get(dtype, 0)
            if isinstance(shape, list) and width:
                dims = [d for d in shape if isinstance(d, int) and not isinstance(d, bool) and d >= 0]
                total += min(prod(dims), MAX_BYTES) * width
    return min(total, MAX_BYTES)  # a crafted shape is a big number, never a float overflow


def _window(tracks: dict[int, Track]) -> tuple[list[int], range]:
    ranks = sorted(r for r, t in tracks.items() if t.by_seq)
    if len(ranks) < 2:
        return ranks, range(0)
    lo = max(tracks[r].first_seq for r in ranks)
    hi = min(tracks[r].last_completed for r in ranks)
    return ranks, range(lo, hi + 1)


def _nan_to_none(values: list[float]) -> list[float | None]:
    return [None if isnan(v) else v for v in values]


class _Arrivals:
    """Who came last at each collective compared by creation time, and each rank's collectives in its
    program order, to tell a rank's own lateness from lateness it inherited.

    A rank that arrives last at a collective because it was itself waiting, in its collective before,
    for a later rank (a tensor-parallel peer of a slow rank reaches the data-parallel all_reduce late)
    did not cost that time: the rank it waited for did. So the gap of the last rank is charged to it only
    up to its own time since its previous collective could finish (the last arrival there); the rest goes
    to whoever arrived last there, and so on back (a few steps at most). "Previous" is in the rank's
    record order (its program order), never guessed from clocks."""

    MAX_DEPTH = 4
    LOOK_BACK = 8  # entries looked at before a collective for the previous counted one

    def __init__(self, dumpset: DumpSet) -> None:
        self.dumpset = dumpset
        self.last: dict[tuple[str, int], tuple[int, int]] = {}  # (group, seq) -> (last rank, its arrival ns)
        self._orders: dict[int, tuple[list[tuple[str, int]], dict[tuple[str, int], int]]] = {}

    def collective(self, group: str, seq: int, rank: int, arrival_ns: int) -> None:
        self.last[(group, seq)] = (rank, arrival_ns)

    def _order(self, rank: int) -> tuple[list[tuple[str, int]], dict[tuple[str, int], int]]:
        """The rank's collectives (group, seq) in record order, and where each is in it."""
        got = self._orders.get(rank)
        if got is None:
            entries = self.dumpset.dumps[rank].entries
            if isinstance(entries, EntryTable):
                pgs, pg, seqs, flags = entries.pgs, entries.pg, entries.seq, entries.flags
                order = [(pgs[pg[i]][0], seqs[i]) for i in sorted(range(len(seqs)), key=entries.record_id.__getitem__)
                         if not flags[i] & 1]
            else:
                order = [(e.pg_name, e.collective_seq_id)
                         for e in sorted(entries, key=lambda e: e.record_id) if not e.is_p2p]
            got = self._orders[rank] = (order, {key: i for i, key in enumerate(order)})
        return got

    def _previous(self, rank: int, group: str, seq: int) -> tuple[str, int] | None:
        order, where = self._order(rank)
        at = where.get((group, seq))
        if at is None:
            return None
        for i in range(at - 1, max(-1, at - 1 - self.LOOK_BACK), -1):
            if order[i] in self.last and order[i] != (group, seq):
                return order[i]
        return None

    def blame(self, events: list[tuple[str, int, int, float]]) -> Iterator[tuple[int, str, float]]:
        """(rank, group, ms) charges for each (group, seq, last rank, gap ms)."""
        for group, seq, rank, gap_ms in events:
            left, at, arrival = gap_ms, (group, seq), self.last[(group, seq)][1]
            for _ in range(self.MAX_DEPTH):
                prev = self._previous(rank, *at)
                if prev is None:
                    break
                held_by, prev_last_ns = self.last[prev]
                own_ms = max(0.0, (arrival - prev_last_ns) / 1e6)
                if held_by == rank or own_ms >= left:
                    break
                if own_ms > 0:
                    yield rank, group, own_ms
                    left -= own_ms
                rank, at, arrival = held_by, prev, prev_last_ns
            yield rank, group, left


def analyze_perf(dumpset: DumpSet, clock_skew_ms: float = DEFAULT_CLOCK_SKEW_MS, *,
                 keep_group: Callable[[str, str], bool] | None = None, keep_op: Callable[[str], bool] | None = None,
                 keep_rank: Callable[[int], bool] | None = None) -> PerfReport:
    """`keep_group(name, desc)`, `keep_op(op)`: only those collectives are counted; `keep_rank(rank)`: only
    those ranks are listed (and named first) among the ranks that cost the job (`frscope analyze --pg --op
    --rank`)."""
    tracks = build_tracks(dumpset)
    rows: dict[tuple[str, str, str], PerfRow] = {}
    costs: dict[int, RankCost] = {}
    counted = 0
    total_wait = 0.0
    total_transfer = 0.0
    any_transfer = False
    used_durations = used_created = False
    first_ns: float | None = None
    last_ns: float | None = None
    active: dict[int, tuple[float, float]] = {}  # rank -> (first created, last end) ns over counted collectives
    blamed: list[tuple[str, int, int, float]] = []  # (group, seq, last rank, gap ms) by creation time
    arrivals = _Arrivals(dumpset)  # creation-time collectives: who came last, for the blame of inherited lateness
    for name, group_tracks in tracks.items():
        info = dumpset.groups.get(name)
        desc = info.desc if info is not None else ""
        if keep_group is not None and not keep_group(name, desc):
            continue
        ranks, window = _window(group_tracks)
        if not window:
            continue
        created_cols = [group_tracks[r].first_created(window) for r in ranks]
        duration_cols = [_nan_to_none(group_tracks[r].first_duration(window)) for r in ranks]
        ref = group_tracks[ranks[0]]
        n = len(ranks)
        waited = [0.0] * n  # per rank of the group, over its counted collectives
        lows: list[float] = [_INF] * n  # per rank: first creation, last end (ns)
        highs: list[float] = [-_INF] * n
        group_count = 0
        # (index of the last rank, its gap, the seq when compared by creation time) per collective
        gaps: list[tuple[int, float, int | None]] = []
        # C-level passes over each collective's column of ranks (at 1,024 ranks x 2,000 collectives a
        # Python loop per (rank, collective) was most of the time)
        for i, seq in enumerate(window):
            bucket = ref.by_seq.get(seq)
            if not bucket or (keep_op is not None and not keep_op(bucket[0].op)):
                continue
            created = [col[i] for col in created_cols]
            durations = [col[i] for col in duration_cols]
            transfer: float | None = None
            dated = all(created)
            if None not in durations:
                ds: list[float] = durations  # type: ignore[assignment]
                transfer = min(ds)
                waits = list(map(sub, ds, repeat(transfer)))
                # the shortest waited least: it arrived last (a tie: the higher rank)
                last = n - 1 - ds[::-1].index(transfer)
                gap = min(ds[:last] + ds[last + 1 :]) - transfer
                skew = 0.0  # durations compare no clocks
                used_durations = True
                ends = list(map(lambda c, d: c + d * 1e6, created, ds)) if dated else None  # type: ignore[operator]
            elif dated:
                cs: list[int] = created  # type: ignore[assignment]
                newest = max(cs)
                waits = list(map(truediv, map(sub, repeat(newest), cs), repeat(1e6)))
                last = n - 1 - cs[::-1].index(newest)
                gap = (newest - max(cs[:last] + cs[last + 1 :])) / 1e6
                skew = clock_skew_ms
                used_created = True
                ends = cs  # type: ignore[assignment]
                arrivals.collective(name, seq, ranks[last], newest)
            else:
                continue
            counted += 1
            group_count += 1
            e0 = bucket[0]
            nbytes = entry_bytes(bucket)
            key = (name, op_label(e0.op) if len(bucket) == 1 else "COALESCED", size_bucket(nbytes))
            row = rows.get(key)
            if row is None:
                row = rows[key] = PerfRow(name, desc, key[1], key[2])
            row.collectives += 1
            row.bytes += nbytes
            wait_sum = sum(waits)
            row.wait_ms += wait_sum
            row.busiest_rank_wait_ms = max(row.busiest_rank_wait_ms, max(waits))
            total_wait += wait_sum
            if transfer is not None:
                row.transfer_ms = (row.transfer_ms or 0.0) + transfer
                row._transfers.append(transfer)
                total_transfer += transfer
                any_transfer = True
            waited = list(map(add, waited, waits))
            if dated and ends is not None:
                lows = list(map(min, lows, created))  # type: ignore[arg-type]
                highs = list(map(max, highs, ends))
            if gap > skew and gap > 0:
                gaps.append((last, gap, seq if transfer is None else None))
        if not group_count:
            continue
        for k, rank in enumerate(ranks):
            cost = costs.get(rank)
            if cost is None:
                cost = costs[rank] = RankCost(rank)
            cost.collectives += group_count
            cost.waited_ms += waited[k]
            if lows[k] != _INF:
                lo, hi = active.get(rank, (lows[k], highs[k]))
                active[rank] = (min(lo, lows[k]), max(hi, highs[k]))
                first_ns = lows[k] if first_ns is None else min(first_ns, lows[k])
                last_ns = highs[k] if last_ns is None else max(last_ns, highs[k])
        for last, gap, seq_by_created in gaps:
            culprit = costs[ranks[last]]
            culprit.last_count += 1
            culprit.gaps.append(gap)
            if seq_by_created is None:
                culprit.cost_ms += gap
                culprit.groups[name] = culprit.groups.get(name, 0.0) + gap
            else:
                blamed.append((name, seq_by_created, ranks[last], gap))
    for rank, group, ms in arrivals.blame(blamed):
        cost = costs[rank]
        cost.cost_ms += ms
        cost.groups[group] = cost.groups.get(group, 0.0) + ms
    timing = "durations" if used_durations else "creation times" if used_created else "none"
    window_ms = (last_ns - first_ns) / 1e6 if first_ns is not None and last_ns is not None else 0.0
    rank_time = sum((hi - lo) / 1e6 for lo, hi in active.values())
    report = PerfReport(
        timing=timing,
        window_ms=window_ms,
        ranks=len(costs),
        collectives=counted,
        wait_ms=total_wait,
        transfer_ms=total_transfer if any_transfer else None,
        rank_time_ms=rank_time,
        rows=sorted(rows.values(), key=lambda r: -(r.wait_ms + (r.transfer_ms or 0.0) * max(1, len(costs)))),
        costs=sorted((c for c in costs.values() if c.cost_ms > 0 and (keep_rank is None or keep_rank(c.rank))),
                     key=lambda c: (-c.cost_ms, c.rank)),
        clock_skew_ms=clock_skew_ms,
        ranks_filtered=keep_rank is not None,
    )
    report.headline = headline(report)
    return report


def _ms(ms: float) -> str:
    if ms >= 60_000:
        return f"{ms / 60_000:.1f} min"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 10:
        return f"{ms:.0f} ms"
    return f"{ms:.2f} ms"


def headline(report: PerfReport) -> str:
    """The first line: the rank that costs the job most, and how much."""
    if not report.collectives:
        return "No collective that every rank completed and dated: nothing to measure."
    if not report.costs and report.ranks_filtered:
        return "None of the ranks asked about holds up the others (other ranks may: run without --rank)."
    if not report.costs:
        return (f"No rank holds up the others: over {report.collectives} collectives nobody arrived last by more "
                f"than {_ms(report.clock_skew_ms)}.")
    top = report.costs[0]
    if top.last_count < MIN_REPEATS:
        return (f"No rank holds up the others repeatedly: the costliest, rank {top.rank}, came last at "
                f"{top.last_count} of its {top.collectives} collectives ({_ms(top.cost_ms)} in all).")
    if len(report.costs) > 1 and top.cost_ms < 2 * report.costs[1].cost_ms:
        return (f"No single rank holds up the others: the waits for the last rank are spread over "
                f"{len(report.costs)} ranks (the most, rank {top.rank}: {_ms(top.cost_ms)} at {top.last_count} of "
                f"{top.collectives} collectives; next, rank {report.costs[1].rank}: {_ms(report.costs[1].cost_ms)}).")
    # groups that run at the same time (tensor and data parallel) can each lose the same wall time: the
    # sum is only a share of the window when it fits in it
    share = (f" ({100 * top.cost_ms / report.window_ms:.0f}% of the {_ms(report.window_ms)} recorded)"
             if 0 < top.cost_ms <= report.window_ms else " (summed over groups that may overlap in time)"
             if len(top.groups) > 1 else "")
    gap = top.median_gap_ms
    where = ", ".join(sorted(top.groups, key=lambda g: -top.groups[g])[:3])
    return (f"Rank {top.rank} costs the job most: {_ms(top.cost_ms)} of wall time{share}, arriving last at "
            f"{top.last_count} of its {top.collectives} collectives, {_ms(gap or 0.0)} after the next-latest rank "
            f"(median; group {where}).")
