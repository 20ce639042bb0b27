"""Cross-group skips: the rank that broke its own order of groups.

A rank that skips a subgroup's collective and goes on to the default group's makes a wait cycle:
its subgroup peers wait for it in the subgroup, and it waits for them in the default group. Both
findings blame someone, and the first of the cycle in time is an accident of timing. What is not an
accident is each rank's own habit: training is a loop, so every rank's ring buffer shows which group
it turns to after which, step after step. Where a rank's order of groups repeats (a step of several
collectives in several groups), the collective it is blocked in must belong to the group its own
loop comes to next; the rank whose open collective does not broke the order. Without a repeating
order, the rank whose last move (from the group of its last finished collective to the group it is
blocked in) never happened before, while another move from that group always did, broke it: it
skipped what it always did next. Neither needs the creation times, which for the two sides of such
a cycle are often within a millisecond of each other.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from frscope.analysis.context import Context
from frscope.records.membership import is_default_group

MIN_HABIT = 2  # the usual next group must have followed at least this often (a loop: seen this many times)
MAX_PERIOD = 64  # collectives per step, at most, for the repeating order of groups
MAX_WINDOW = 4 * MAX_PERIOD
MAX_COMPARED = 64  # ranks whose program order a rank is compared with


@dataclass(frozen=True, slots=True)
class Breach:
    rank: int
    after_group: str  # the group of the rank's last finished collective before the blocked one
    after_seq: int
    went_to: str  # the group it is blocked in
    went_seq: int
    usual: str  # the group that always followed `after_group` before
    usual_count: int
    skipped_seq: int  # the collective of `usual` it skipped (its last seq there + 1)
    by_peers: bool = False  # `usual_count` counts its peers that went there, not its own earlier steps


def _labels(ctx: Context, rank: int) -> tuple[list[tuple[str, int]], tuple[str, int] | None]:
    """The rank's collectives as (group, seq), coalesced ops once, in the order it issued them: the ones
    before its first open collective, and that one (None when nothing is open)."""
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None:
        return [], None
    done: list[tuple[str, int]] = []
    for entry in dump.entries:
        if entry.is_p2p:
            continue
        label = (entry.pg_name, entry.collective_seq_id)
        if not entry.completed:
            return done, label
        if not done or done[-1] != label:
            done.append(label)
    return done, None


def _loop(groups: list[str], now: str) -> tuple[int, int] | None:
    """The rank's loop as (period, end): `groups[:end]` repeats with `period` over a stretch that holds
    every group the rank used (and the open one's: a run of one group inside a step is no loop), at
    least `MIN_HABIT` times; `end` is within the last period (a rank may have left its loop a
    collective or two before the one it is blocked in). The stretch that reaches furthest back wins
    (the shortest period of equals, the latest end)."""
    n = len(groups)
    used = {*groups, now}
    best: tuple[int, int, int, int] | None = None  # (matches, -period, end, period)
    for period in range(1, min(MAX_PERIOD, n // MIN_HABIT) + 1):
        for end in range(n, max(n - period, MIN_HABIT * period) - 1, -1):
            j = end - 1
            while j >= period and groups[j] == groups[j - period]:
                j -= 1
            matches = end - 1 - j
            if matches < (MIN_HABIT - 1) * period or not used <= set(groups[end - matches - period : end]):
                continue
            key = (matches, -period, end, period)
            if best is None or key > best:
                best = key
    return (best[3], best[2]) if best else None


def _periodic_breach(done: list[tuple[str, int]], now: tuple[str, int], rank: int) -> Breach | bool | None:
    """Training is a loop: the order of groups a rank issued repeats step after step. The rank that,
    since its loop's last clean period, issued a collective of another group than its loop comes to
    next (the open one, or one just before it) broke the order. False: the order repeats and the rank
    kept it; None: no repeating order to judge by."""
    window = done[-MAX_WINDOW:]
    groups = [g for g, _ in window]
    found = _loop(groups, now[0])
    if found is None:
        return None
    period, end = found
    loop = groups[end - period : end]
    tail = [*window[end:], now]
    for i, (group, seq) in enumerate(tail):
        expected = loop[i % period]
        if group == expected:
            continue
        before = window[end + i - 1] if end + i - 1 >= 0 else tail[0]
        last_seq = max((s for g, s in done[: len(done) - len(window) + end + i] if g == expected), default=0)
        return Breach(rank, before[0], before[1], group, seq, expected, end // period, last_seq + 1)
    return False


def breach_of(ctx: Context, rank: int) -> Breach | None:
    done, now = _labels(ctx, rank)
    if now is None or not done:
        return None
    peers = _peer_breach(ctx, rank, done, now)
    if peers is not None:
        return peers if isinstance(peers, Breach) else None
    periodic = _periodic_breach(done, now, rank)
    if periodic is not None:
        return periodic if isinstance(periodic, Breach) else None
    return _program_breach(ctx, rank) or _habit_breach(ctx, rank)


MAX_ANCHOR_BACK = 8  # finished collectives looked back over for one the peers share
MAX_AHEAD = 16  # collectives after the anchor compared


def _kind(ctx: Context, group: str) -> str:
    """What a group is for, across the ranks: its description (tp, dp, mesh_x, ...), else its name."""
    info = ctx.dumpset.groups.get(group)
    return info.desc if info is not None and info.desc else group


def _after(ctx: Context, rank: int, anchor: tuple[str, int], limit: int) -> list[tuple[str, int]] | None:
    """The rank's collectives (coalesced) after `anchor`, up to its first open one; None: no anchor."""
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None:
        return None
    out: list[tuple[str, int]] = []
    seen = False
    for entry in dump.entries:
        if entry.is_p2p:
            continue
        label = (entry.pg_name, entry.collective_seq_id)
        if not seen:
            seen = label == anchor
            continue
        if label != anchor and (not out or out[-1] != label):
            out.append(label)
        if not entry.completed or len(out) >= limit:
            break
    return out if seen else None


def _roles(ctx: Context) -> dict[int, frozenset[str]]:
    """Each rank's kinds of groups: ranks of one role in an SPMD program belong to groups of the same kinds."""
    roles: dict[int, set[str]] = {}
    for name, info in ctx.dumpset.groups.items():
        kind = _kind(ctx, name)
        for r in info.ranks:
            roles.setdefault(r, set()).add(kind)
    return {r: frozenset(k) for r, k in roles.items()}


def _peer_breach(ctx: Context, rank: int, done: list[tuple[str, int]], now: tuple[str, int]) -> Breach | bool | None:
    """Every rank runs the same program: after the last collective it finished together with its peers
    (the anchor), the ranks issue the same kinds of groups in the same order. The rank that, there,
    issued another kind than most of its peers did broke the order; the ranks that kept the common
    order never did, whatever their own habit says (a checkpoint barrier runs once and breaks no loop).
    False: the rank kept its peers' order; None: no peers to compare with."""
    mine_all = [*done, now]
    roles = _roles(ctx)
    for back in range(1, min(MAX_ANCHOR_BACK, len(done)) + 1):
        anchor = done[-back]
        peers: list[list[tuple[str, int]]] = []
        for other in sorted(ctx.tracks.get(anchor[0], {}))[: MAX_COMPARED + 1]:
            if other == rank or roles.get(other) != roles.get(rank):
                continue  # a rank without groups of the same kinds runs another program
            after = _after(ctx, other, anchor, back + MAX_AHEAD)
            if after is not None:
                peers.append(after)
        if len(peers) < MIN_HABIT:
            continue
        mine = mine_all[len(mine_all) - back:]
        for i, (group, seq) in enumerate(mine):
            kinds = Counter(_kind(ctx, p[i][0]) for p in peers if len(p) > i)
            total = sum(kinds.values())
            if total < MIN_HABIT:
                return None
            usual, count = kinds.most_common(1)[0]
            if _kind(ctx, group) == usual:
                continue
            if count * 2 <= total:
                return None  # no common order here to judge by
            own = [g for g, info in ctx.dumpset.groups.items() if _kind(ctx, g) == usual and rank in info.ranks]
            if len(own) != 1:
                return None
            before = mine[i - 1] if i else anchor
            last_seq = max((s for g, s in done if g == own[0]), default=0)
            return Breach(rank, before[0], before[1], group, seq, own[0], count, last_seq + 1, by_peers=True)
        return False
    return None


Op = tuple[str, str, int]  # (group desc, group name, seq)


def _segment(ctx: Context, rank: int, default: str) -> tuple[int, list[Op]] | None:
    """The rank's collectives since its last finished collective of the default group (k), up to and
    including its first open one: (k, [(desc, group, seq), ...]). None when nothing is open."""
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None:
        return None
    k = 0
    ops: list[Op] = []
    for entry in dump.entries:
        if entry.is_p2p:
            continue
        op = (entry.pg_desc, entry.pg_name, entry.collective_seq_id)
        if entry.pg_name == default and entry.completed:
            k = entry.collective_seq_id
            ops = []
            continue
        if not ops or ops[-1] != op:
            ops.append(op)
        if not entry.completed:
            return k, ops
    return None


def _program_divergence(ctx: Context, rank: int) -> tuple[int, list[Op], int, str, int] | None:
    """Where the rank left the program every rank runs: after the same default-group collective (#k) the
    ranks issue the same kinds of groups (by their description: tp, dp, ...) in the same order, and the
    rank issued another kind than most ranks did at that place. (k, its ops since #k, the place, the usual
    kind there, how many ranks issued it). None where it kept the order, or no order is common."""
    default = next((n for n, g in ctx.dumpset.groups.items() if is_default_group(n, g.desc)), None)
    if default is None:
        return None
    mine = _segment(ctx, rank, default)
    if mine is None:
        return None
    k, ops = mine
    others: list[list[Op]] = []
    for other in sorted(ctx.dumpset.dumps)[:MAX_COMPARED]:
        if other == rank:
            continue
        seg = _segment_after(ctx, other, default, k)
        if seg:
            others.append(seg)
    for i, (desc, _name, _seq) in enumerate(ops):
        kinds = Counter(seg[i][0] for seg in others if len(seg) > i)
        if sum(kinds.values()) < MIN_HABIT:
            return None
        usual, count = kinds.most_common(1)[0]
        if desc == usual or count * 2 <= sum(kinds.values()):
            continue
        return k, ops, i, usual, count
    return None


def skipped_kind(ctx: Context, rank: int) -> str | None:
    """The kind of group (its description) the rank skipped where it left the program every rank runs
    (`_program_divergence`), whether or not its recorder shows its own group of that kind: a rank that
    never recorded in the group it skipped still shows the skip in its order. None where it kept it."""
    found = _program_divergence(ctx, rank)
    return found[3] if found is not None else None


def describe_skip(ctx: Context, rank: int, group: str) -> str:
    """`skipped_kind`'s reading, in words (`group`: the label of the group of that kind it never joined)."""
    found = _program_divergence(ctx, rank)
    if found is None:
        return ""
    k, ops, i, usual, count = found
    return (f"rank {rank} broke the order its peers kept: after the default group's #{k}, {count} ranks issued a "
            f"collective of {usual} next, but it went to #{ops[i][2]} of group {ops[i][1]} instead, never joining "
            f"{group}")


def behind_on_kind(ctx: Context, group: str, ranks: list[int]) -> list[int]:
    """Of `ranks` (which recorded nothing of `group`), those that issued fewer collectives of the group's kind
    than each of its members did (the one they wait in included): a rank that issued as many ran its own group's
    collective of that kind where they ran theirs, and kept the order. All of `ranks` where a count is unknown
    (a ring that wrapped) or the members' counts differ."""
    kind = _kind(ctx, group)

    def count(rank: int) -> int | None:
        dump = ctx.dumpset.dumps.get(rank)
        if dump is None or (len(dump.entries) and dump.entries[0].record_id != 0):
            return None
        return len({(e.pg_name, e.collective_seq_id) for e in dump.entries
                    if not e.is_p2p and _kind(ctx, e.pg_name) == kind})

    need = {count(m) for m in ctx.tracks.get(group, {})}
    if len(need) != 1 or None in need:
        return list(ranks)
    n = need.pop() or 0
    return [r for r in ranks if (c := count(r)) is None or c < n]


def family_kind(ctx: Context, group: str) -> str | None:
    """The group's kind where groups of that kind form a family (another group shares its description, as a
    mesh dimension's or a new_subgroups split's do): only then is every rank's own group of that kind likely,
    so a rank that issued none where its peers did skipped it. None for a lone group of its kind, and for
    'undefined' (new_subgroups' and a bare new_group's description: it names no kind, principle 3)."""
    kind = _kind(ctx, group)
    if kind == "undefined" or not any(name != group and _kind(ctx, name) == kind for name in ctx.dumpset.groups):
        return None
    return kind


def _program_breach(ctx: Context, rank: int) -> Breach | None:
    """Without a loop of its own to judge by (a fault in the first steps): every rank runs the same
    program, so after the same default-group collective the ranks issue the same kinds of groups (by
    their description: tp, dp, ...) in the same order. The rank that, there, issued another kind than
    most ranks did at that place broke the order (its own group of the usual kind is what it skipped)."""
    found = _program_divergence(ctx, rank)
    if found is None:
        return None
    k, ops, i, usual, count = found
    _desc, name, seq = ops[i]
    groups = {n for d, n, _s in _all_ops(ctx, rank) if d == usual}
    if len(groups) != 1:
        return None  # its own group of that kind is unknown (`skipped_kind` still tells the kind)
    group = groups.pop()
    last_seq = max((s for d, n, s in _all_ops(ctx, rank) if n == group), default=0)
    default = next(n for n, g in ctx.dumpset.groups.items() if is_default_group(n, g.desc))
    before = ops[i - 1] if i else (default, default, k)
    return Breach(rank, before[1], before[2], name, seq, group, count, last_seq + 1)


def _all_ops(ctx: Context, rank: int) -> list[Op]:
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None:
        return []
    return [(e.pg_desc, e.pg_name, e.collective_seq_id) for e in dump.entries if not e.is_p2p]


def _segment_after(ctx: Context, rank: int, default: str, k: int) -> list[Op]:
    """The rank's collectives after default-group collective #k (before #k + 1), coalesced."""
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None:
        return []
    ops: list[Op] = []
    inside = k == 0
    for entry in dump.entries:
        if entry.is_p2p:
            continue
        if entry.pg_name == default:
            if inside:
                break
            inside = entry.collective_seq_id == k
            continue
        op = (entry.pg_desc, entry.pg_name, entry.collective_seq_id)
        if inside and (not ops or ops[-1] != op):
            ops.append(op)
    return ops


def _habit_breach(ctx: Context, rank: int) -> Breach | None:
    """Without a repeating order: the rank's last move between groups never happened before, while
    another move from that group always did."""
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None:
        return None
    ops = [e for e in dump.entries if not e.is_p2p]
    blocked = next((i for i, e in enumerate(ops) if not e.completed), None)
    if blocked is None or blocked == 0:
        return None
    before, now = ops[blocked - 1], ops[blocked]
    if before.pg_name == now.pg_name and before.collective_seq_id == now.collective_seq_id:
        return None  # coalesced ops: not a move between groups
    follows: Counter[str] = Counter()
    last_seq: dict[str, int] = {}
    for prev, cur in zip(ops[: blocked - 1], ops[1:blocked], strict=True):
        last_seq[prev.pg_name] = prev.collective_seq_id
        if prev.pg_name == before.pg_name and not (
            prev.pg_name == cur.pg_name and prev.collective_seq_id == cur.collective_seq_id
        ):
            follows[cur.pg_name] += 1
    last_seq[before.pg_name] = before.collective_seq_id
    if follows[now.pg_name] or not follows:
        return None  # it has moved this way before (or has no history to compare with)
    usual, count = follows.most_common(1)[0]
    if count < MIN_HABIT:
        return None
    return Breach(rank, before.pg_name, before.collective_seq_id, now.pg_name, now.collective_seq_id, usual, count,
                  last_seq.get(usual, 0) + 1)


def describe(ctx: Context, breach: Breach) -> str:
    def label(name: str) -> str:
        group = ctx.dumpset.groups.get(name)
        desc = f" ({group.desc})" if group and group.desc and group.desc != "undefined" else ""
        return f"group {name}{desc}"

    if breach.by_peers:
        return (
            f"rank {breach.rank} broke the order its peers kept: after #{breach.after_seq} of "
            f"{label(breach.after_group)}, {breach.usual_count} of its peers went on to the kind of "
            f"{label(breach.usual)}, but it went to #{breach.went_seq} of {label(breach.went_to)} instead, "
            f"skipping #{breach.skipped_seq} of {label(breach.usual)}"
        )
    return (
        f"rank {breach.rank} broke its own order of groups: after {label(breach.after_group)} it went on to "
        f"{label(breach.usual)} {breach.usual_count} times in its earlier steps, but after #{breach.after_seq} it "
        f"went to #{breach.went_seq} of {label(breach.went_to)} instead, skipping #{breach.skipped_seq} of "
        f"{label(breach.usual)}"
    )
