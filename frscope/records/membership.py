"""Who belongs to which process group, reconstructed across every rank's dump.

`pg_config` is not always truthful: ProcessGroupGloo records its ranks before distributed_c10d has
named the group, so gloo dumps key the default group '' with ranks '[]' (or the ranks of whichever
group was built last), while the entries say ('0', 'default_pg'). torchfrtrace trusts pg_config and
dies with KeyError: ('0', 1). Here a group's identity is the name its entries carry; its members are
the ranks its pg_config says by majority across dumps, else (default group) the whole world, else
the ranks whose dumps hold entries of that group. The world is at least as big as every rank any
dump's `pg_config` lists, so a rank that left no dump is missing even when no other dump names it.
Nothing is inferred from a description string: groups that share one (DeviceMesh's `mesh_*`,
`new_subgroups`' `undefined`, one `new_group` per slice) may be uneven, so they imply no world size.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from frscope.records.columns import EntryTable
from frscope.records.limits import MAX_RANK
from frscope.records.model import GroupInfo, RankDump

DEFAULT_GROUP_NAME = "0"
DEFAULT_GROUP_DESC = "default_pg"


def is_default_group(name: str, desc: str) -> bool:
    return desc == DEFAULT_GROUP_DESC or (name == DEFAULT_GROUP_NAME and desc in ("", "undefined"))


def build_groups(
    dumps: dict[int, RankDump], world_size_hint: int | None = None
) -> tuple[dict[str, GroupInfo], int, list[str]]:
    """Return (groups by name, world size, warnings)."""
    warnings: list[str] = []
    seen: dict[str, set[int]] = {}
    descs: dict[str, Counter[str]] = {}
    for rank, dump in dumps.items():
        pgs: dict[str, str] = {}
        if isinstance(dump.entries, EntryTable):
            pgs = dump.entries.group_descs()
        else:
            for entry in dump.entries:
                if entry.pg_name not in pgs:
                    pgs[entry.pg_name] = entry.pg_desc
        for name, desc in pgs.items():
            seen.setdefault(name, set()).add(rank)
            descs.setdefault(name, Counter())[desc] += 1

    config_desc: dict[str, str] = {}
    # Every rank any group lists is a rank of the job, also in gloo's unnamed '' entry (whose list is
    # some group's, not necessarily the default group's): the world is at least that big.
    listed = 0
    # Every rank's dump lists the default group's N members: the loader hands one tuple to every rank that
    # lists the same ranks, so each distinct tuple object is measured and hashed once, not once per rank
    # (N² work at 32,768 ranks). Votes are counted per object, then per content in order of first vote.
    top_of: dict[int, int] = {}
    by_object: dict[str, dict[int, list[Any]]] = {}
    for dump in dumps.values():
        for cfg in dump.pg_config.values():
            ranks = cfg.ranks
            if ranks:
                top = top_of.get(id(ranks))
                if top is None:
                    top = top_of[id(ranks)] = max(ranks) + 1
                listed = max(listed, top)
            # Gloo's unnamed '' entry names no group: its ranks are not a membership.
            if not cfg.name or ranks is None:
                continue
            counted = by_object.setdefault(cfg.name, {}).get(id(ranks))
            if counted is None:
                by_object[cfg.name][id(ranks)] = [ranks, 1]
            else:
                counted[1] += 1
            config_desc.setdefault(cfg.name, cfg.desc)
    votes: dict[str, Counter[tuple[int, ...]]] = {}
    for name, counted_objects in by_object.items():
        counter = votes[name] = Counter()
        for ranks, count in counted_objects.values():
            counter[ranks] += count

    # Every rank here is below limits.MAX_RANK (normalize refuses others), so `range(world)` is bounded.
    hint = world_size_hint if world_size_hint is not None and 0 < world_size_hint <= MAX_RANK else 0
    world = max([hint, listed, *(r + 1 for r in dumps)] or [0])
    for name, counter in votes.items():
        ranks = counter.most_common(1)[0][0]
        world = max(world, max(ranks) + 1)
        desc = config_desc.get(name, "")
        if is_default_group(name, desc):
            world = max(world, len(ranks))

    groups: dict[str, GroupInfo] = {}
    for name in sorted(set(seen) | set(votes), key=_group_sort_key):
        desc_counter = descs.get(name)
        desc = desc_counter.most_common(1)[0][0] if desc_counter else config_desc.get(name, "")
        members_seen = seen.get(name, set())
        if name in votes:
            counter = votes[name]
            ranks = counter.most_common(1)[0][0]
            if len(counter) > 1:
                warnings.append(
                    f"process group {name!r}: dumps disagree on its ranks ({len(counter)} versions); "
                    f"using the majority {list(ranks)}"
                )
            extra = members_seen - set(ranks)
            if extra:
                warnings.append(
                    f"process group {name!r}: ranks {sorted(extra)} have its entries but are not in "
                    "its pg_config; counted as members"
                )
            groups[name] = GroupInfo(name, desc, tuple(sorted(set(ranks) | extra)), "pg_config")
        elif is_default_group(name, desc):
            groups[name] = GroupInfo(name, desc, tuple(range(world)), "world")
        else:
            groups[name] = GroupInfo(name, desc, tuple(sorted(members_seen)), "entries")
    return groups, world, warnings


def _group_sort_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)
