"""Cross-group skips: the rank that broke its own order of groups.

A rank that skips a subgroup's collective and goes on to the default group's makes a wait cycle:
its subgroup peers wait for it in the subgroup, and it waits for them in the default group. Both
findings blame someone, and the first of the cycle in time is an accident of timing. What is not an
accident is each rank's own habit: training is a loop, so every rank's ring buffer shows which group
it turns to after which, step after step. The rank whose last move (from the group of its last
finished collective to the group it is blocked in) never happened before, while another move from
that group always did, broke the order: it skipped what it always did next.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from frscope.analysis.context import Context

MIN_HABIT = 2  # the usual next group must have followed at least this often


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


def breach_of(ctx: Context, rank: int) -> Breach | None:
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

    return (
        f"rank {breach.rank} broke its own order of groups: after {label(breach.after_group)} it went on to "
        f"{label(breach.usual)} {breach.usual_count} times in its earlier steps, but after #{breach.after_seq} it "
        f"went to #{breach.went_seq} of {label(breach.went_to)} instead, skipping #{breach.skipped_seq} of "
        f"{label(breach.usual)}"
    )
