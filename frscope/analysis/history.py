"""The mismatch scan: the earliest collective of a group on which its ranks disagreed (type, sizes,
dtypes). With equal byte counts gloo completes such a collective silently with wrong data, so the
whole visible history is scanned, and the earliest disagreement is what counts.

Two ways to the same answer. The reference walks every sequence number and compares every rank's
entries with the first rank's. Ranks loaded as columns carry a signature code per sequence number
(`records.columns`), unified across the dump set: a rank whose codes equal the reference codes over
its whole window is compared in one C-level array comparison, and only the sequence numbers where
some code differs (or whose op has per-rank sizes, which need their totals checked) are built into
`Entry` buckets and judged by exactly the reference's code. `history` (the group's last agreed
collectives, whose repeating order breaks ties) is the same buckets either way: the reference rank's at
the latest earlier sequence numbers that produced no problem.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence
from itertools import islice
from typing import Any

from frscope.analysis.context import Context
from frscope.analysis.findings import Finding, GroupRef
from frscope.analysis.mismatch import HISTORY, Bucket, classify_mismatch, same, self_consistency
from frscope.analysis.ops import VARIABLE_SIZE_OPS
from frscope.analysis.tracks import Track
from frscope.records import P2P_OPS, Entry, GroupInfo
from frscope.records.columns import SignatureSpace, space_of


def _agreed(history: list[Bucket], bucket: Bucket) -> None:
    history.append(bucket)
    if len(history) > HISTORY:
        del history[0]


def _first_whole(ctx: Context, group: str, rank: int, track: Track) -> int:
    """The first seq of the rank's window in `group` whose entries are all there. Where its ring wrapped
    (its oldest entry is not record 0), the entries of this group's oldest seq that came before the oldest
    record held are gone: a coalesced call's ops are consecutive records, so they are cut only where the
    call begins the ring; entries recorded apart under one seq (an older format records a step's
    batch_isend_irecv under the group's current collective seq, after the collective that opened it, one
    step after another) may have lost their head wherever the ring begins."""
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None or not len(dump.entries) or not dump.entries[0].record_id:
        return track.first_seq
    ids = [e.record_id for e in track.peek(track.first_seq)]
    if ids and (ids[0] == dump.entries[0].record_id or ids != list(range(ids[0], ids[0] + len(ids)))):
        return track.first_seq + 1
    if ids and _p2p_under_collective_seqs(track):
        return track.first_seq + 1  # the oldest seq's opening collective may be gone, whatever is left of it
    return track.first_seq


def _p2p_under_collective_seqs(track: Track, looked_at: int = 4) -> bool:
    """Whether the rank's recorder numbers its sends and recvs under the group's collective seq (the older
    format), seen in its oldest few seqs of the group: then any bucket may hold ops recorded steps apart."""
    for k, seq in enumerate(track.by_seq):
        if k >= looked_at:
            break
        bucket = track.peek(seq)
        if any(e.op in P2P_OPS for e in bucket):
            return True
        # A batch_isend_irecv recorded as one `coalesced` entry under the collective seq advances the p2p seq
        # where a collective (coalesced or not) does not: entries of one seq whose p2p seqs differ.
        if len({e.p2p_seq_id for e in bucket}) > 1:
            return True
    return any(e.collective_seq_id for e in islice(track.p2p, looked_at))  # its p2p ops carry the seq


def scan_history(ctx: Context, group: GroupInfo, ref: GroupRef, tracks: dict[int, Track]) -> Finding | None:
    """The earliest collective on which the ranks disagreed, with later disagreements counted in."""
    with_entries = [(r, t) for r, t in sorted(tracks.items()) if t.by_seq]
    if len(with_entries) < 1:
        return None
    lo = max(_first_whole(ctx, group.name, r, t) for r, t in with_entries)
    hi = max(t.last_seq for _, t in with_entries)
    space = _code_space(with_entries)
    if space is not None:
        return _scan_codes(ctx, group, ref, with_entries, lo, hi, space)
    first: Finding | None = None
    later = 0
    history: list[Bucket] = []  # the last agreed collectives, oldest first
    # The seqs some rank recorded, not every number between: one crafted seq of 10**15 must not
    # make this loop that long.
    recorded = sorted({seq for _, t in with_entries for seq in t.by_seq if lo <= seq <= hi})
    for seq in recorded:
        ref_bucket: Bucket | None = None
        ref_sig: tuple[object, ...] = ()
        differs = False
        for _rank, track in with_entries:
            bucket = track.by_seq.get(seq)
            if bucket is None:
                continue
            if ref_bucket is None:
                ref_bucket = bucket
                x = bucket[0]
                ref_sig = (len(bucket), x.op, x.input_sizes, x.output_sizes, x.input_dtypes, x.output_dtypes)
                continue
            # Inlined common case of `same` (one entry, identical call): this loop runs ranks x seqs times.
            y = bucket[0]
            if ref_sig == (len(bucket), y.op, y.input_sizes, y.output_sizes, y.input_dtypes, y.output_dtypes) and (
                len(bucket) == 1
            ):
                continue
            if not same(ref_bucket, bucket):
                differs = True
                break
        if ref_bucket is None:
            continue
        if not differs and not any(e.op in VARIABLE_SIZE_OPS for e in ref_bucket):
            # Every rank passed what the first did: only split-size ops still need their totals checked.
            _agreed(history, ref_bucket)
            continue
        buckets = {r: b for r, t in with_entries if (b := t.by_seq.get(seq)) is not None}
        buckets, differs = _without_cut_reads(ctx, buckets, differs)
        # A rank whose all_gather / reduce_scatter does not fit the group size is the culprit even
        # without a majority (two ranks); otherwise the majority decides.
        problem = self_consistency(ctx, group, ref, seq, buckets)
        if problem is None and differs:
            problem = _disagreement(ctx, group, ref, seq, buckets, history)
        if problem is not None:
            if first is None:
                first = problem
            else:
                later += 1
        else:
            _agreed(history, ref_bucket)
    if first is not None and later:
        first.evidence.append(
            f"{later} later collective{'s' if later != 1 else ''} of {ref.label()} disagree as well "
            "(consequences of this one)."
        )
    return first


def _disagreement(ctx: Context, group: GroupInfo, ref: GroupRef, seq: int, buckets: dict[int, Bucket],
                  history: Sequence[Bucket]) -> Finding | None:
    """The mismatch the ranks in the collective show (`classify_mismatch`), unless its odd side entered it
    ahead of its own order: members that never entered it wait, through the wait-for graph, on an odd rank
    (blocked in another group's collective it never joined, or on its p2p peer). Had that rank kept the
    others' order it would have joined that collective first, and they would all be here. Its call here is
    an extra one, or the one after a call it skipped, and it meets what the others will call here (principle
    1: a cycle's culprit is the rank whose order differs): the wait-for graph decides, not the ops."""
    found = classify_mismatch(ctx, ref, seq, buckets, history)
    if found is None or not found.culprit_ranks:
        return found
    tracks = ctx.tracks.get(group.name, {})
    absent = [r for r in group.ranks if r not in buckets and ((t := tracks.get(r)) is None or t.last_seq < seq)]
    if absent and ctx.waits.reaches(absent, frozenset(found.culprit_ranks)):
        return None
    return found


def _without_cut_reads(ctx: Context, buckets: dict[int, Bucket], differs: bool) -> tuple[dict[int, Bucket], bool]:
    """Evidence must agree: a rank whose recorder was read before the others recorded the rest of a bucket
    holds a prefix of it: read between the parts of a coalesced op (recorded one by one), or a stale read
    that ends before the peers' later entry under the same seq (an older format's p2p batch shares the
    collective seq). Everything it recorded after its part, the peers recorded too before their next part.
    Its read is older, not a different call: it is left out of the comparison here, and the others'
    agreement decides whether they differ."""
    if not differs or len(buckets) < 2:
        return buckets, differs
    full_rank, full = max(buckets.items(), key=lambda kv: len(kv[1]))
    kept: dict[int, Bucket] = {}
    for rank, bucket in buckets.items():
        if len(bucket) < len(full) and same(list(full[: len(bucket)]), bucket) and _read_before(
                ctx, rank, bucket[-1], full_rank, full[len(bucket) - 1], full[len(bucket)]):
            continue
        kept[rank] = bucket
    if len(kept) == len(buckets) or not kept:
        return buckets, differs
    first = next(iter(kept.values()))
    return kept, any(not same(first, b) for b in kept.values())


def _read_before(ctx: Context, rank: int, last: Entry, peer: int, peer_last: Entry, peer_next: Entry) -> bool:
    """Whether `rank`'s recorder ends before the point where `peer` recorded `peer_next`: what `rank` holds
    after `last` is, op for op (a p2p op for a p2p op), what `peer` recorded between `peer_last` and
    `peer_next`, or a prefix of it."""
    mine, theirs = ctx.dumpset.dumps.get(rank), ctx.dumpset.dumps.get(peer)
    if mine is None or theirs is None:
        return False
    start, end = _position(mine.entries, last.record_id) + 1, len(mine.entries)
    p_start, p_end = _position(theirs.entries, peer_last.record_id) + 1, _position(theirs.entries, peer_next.record_id)
    if start <= 0 or p_start <= 0 or end - start > p_end - p_start:
        return False
    return all(_step_key(a) == _step_key(b) for a, b in zip((mine.entries[k] for k in range(start, end)),
                                                             (theirs.entries[k] for k in range(p_start, p_end)),
                                                             strict=False))


def _step_key(e: Entry) -> tuple[str, int, str]:
    """What two ranks' recorders share at the same point of a program: a p2p op's two sides differ in name
    (one sends, the other receives)."""
    return e.pg_name, e.collective_seq_id, "p2p" if e.is_p2p else e.op


def _position(entries: Sequence[Entry], record_id: int) -> int:
    """Where the entry `record_id` is in a recorder (ascending record ids); -1: not there."""
    k = bisect_left(entries, record_id, key=lambda e: e.record_id)
    return k if k < len(entries) and entries[k].record_id == record_id else -1


def _code_space(with_entries: list[tuple[int, Track]]) -> SignatureSpace | None:
    """The shared signature space when every rank is columnar, unified, with a contiguous run of seqs."""
    tables = []
    for _rank, track in with_entries:
        if track.table is None or track.index is None or not track.index.contiguous:
            return None
        tables.append(track.table)
    return space_of(tables)


def _has_variable_op(content: Any) -> bool:
    return any(item[0] in VARIABLE_SIZE_OPS for item in content)


def _scan_codes(ctx: Context, group: GroupInfo, ref: GroupRef, with_entries: list[tuple[int, Track]], lo: int,
                hi: int, space: SignatureSpace) -> Finding | None:
    if hi < lo:
        return None
    # Each rank's codes for lo..min(hi, its last): every rank's first seq is <= lo, so only the end varies.
    slices: list[array[int]] = []
    for _rank, track in with_entries:
        index = track.index
        assert index is not None
        start, stop = lo - index.first_seq, min(hi, index.last_seq) - index.first_seq + 1
        slices.append(index.sig[start:stop] if stop > start else array("I"))
    # The reference code at each position: the first rank (in rank order) that has that seq.
    codes = array("I")
    owner: list[int] = []  # per position, the index into with_entries of the reference rank
    for j, piece in enumerate(slices):
        if len(piece) > len(codes):
            owner.extend([j] * (len(piece) - len(codes)))
            codes.extend(list(piece[len(codes) :]))  # ranks' codes may be narrower arrays ('B', 'H')
    interesting: set[int] = set()
    for piece in slices:
        n = len(piece)
        if n and piece != codes[:n]:
            interesting.update(k for k in range(n) if piece[k] != codes[k])
    for code in set(codes):
        if space.fact(code, "variable", _has_variable_op):
            interesting.update(k for k in range(len(codes)) if codes[k] == code)
    if not interesting:
        return None

    def bucket_at(j: int, k: int) -> Bucket:
        got = with_entries[j][1].by_seq.get(lo + k)
        assert got is not None
        return got

    first: Finding | None = None
    later = 0
    problems: set[int] = set()
    agreed_pairs: dict[tuple[int, int], bool] = {}
    for k in sorted(interesting):
        seq = lo + k
        code = codes[k]
        ref_bucket = bucket_at(owner[k], k)
        differs = False
        for j, piece in enumerate(slices):
            if len(piece) <= k or piece[k] == code:
                continue
            pair = (code, piece[k])
            agreed = agreed_pairs.get(pair)
            if agreed is None:
                agreed = agreed_pairs[pair] = same(ref_bucket, bucket_at(j, k))
            if not agreed:
                differs = True
                break
        if not differs and not space.fact(code, "variable", _has_variable_op):
            continue  # the reference's history is this bucket: no problem here
        buckets = {r: b for r, t in with_entries if (b := t.by_seq.get(seq)) is not None}
        buckets, differs = _without_cut_reads(ctx, buckets, differs)
        problem = self_consistency(ctx, group, ref, seq, buckets)
        if problem is None and differs:
            before: list[Bucket] = []
            h = k - 1
            while h >= 0 and len(before) < HISTORY:
                if h not in problems:
                    before.append(bucket_at(owner[h], h))
                h -= 1
            problem = _disagreement(ctx, group, ref, seq, buckets, before[::-1])
        if problem is not None:
            problems.add(k)
            if first is None:
                first = problem
            else:
                later += 1
    if first is not None and later:
        first.evidence.append(
            f"{later} later collective{'s' if later != 1 else ''} of {ref.label()} disagree as well "
            "(consequences of this one)."
        )
    return first
