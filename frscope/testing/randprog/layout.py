"""Random process-group layouts: the world plus families of subgroups, created the way torch creates them.

Every rank calls `new_group` for every group (members or not), so a group's name is the global creation
counter as text ('0' is the default group); its `pg_id` on a rank is the rank-local uid (the index among
the groups that rank belongs to, in creation order). Families cover what real jobs build: a dp x tp grid
(`new_group` descriptions or DeviceMesh's `mesh_<dim>`), strided groups, `new_subgroups` (described
`undefined`), uneven groups under one description, one non-contiguous subset, and a 1-D DeviceMesh over
the world, which reuses the default group instead of creating one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# How a group came to be: decides gloo's `pg_config` quirk (see recorder.py).
DEFAULT, NEW_GROUP, MESH, SUBGROUPS = "default", "new_group", "mesh", "subgroups"


@dataclass(frozen=True, slots=True)
class Group:
    index: int  # creation order over the whole job; 0 = the default group
    name: str
    desc: str
    ranks: tuple[int, ...]  # global ranks, in group-rank order
    style: str

    def local(self, rank: int) -> int:
        return self.ranks.index(rank)


@dataclass(frozen=True, slots=True)
class Layout:
    world: int
    groups: tuple[Group, ...]
    # Each family: the indices of groups that split (some of) the world the same way; a program's ops
    # on a family run on every group of it (SPMD).
    families: tuple[tuple[int, ...], ...]

    def member_groups(self, rank: int) -> list[Group]:
        return [g for g in self.groups if rank in g.ranks]

    def uid(self, rank: int, group: int) -> int:
        """The rank-local uid torch gives `group` on `rank` (its `pg_id` in the recorder)."""
        return [g.index for g in self.member_groups(rank)].index(group)

    def to_json(self) -> dict[str, object]:
        return {"world": self.world, "groups": [[g.name, g.desc, list(g.ranks), g.style] for g in self.groups],
                "families": [list(f) for f in self.families]}


def _world(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.85:
        return rng.choice((2, 2, 3, 4, 4, 4, 5, 6, 6, 8, 8))
    if roll < 0.97:
        return rng.choice((9, 10, 12, 16))
    return rng.choice((24, 32, 48, 64))


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


def _families(rng: random.Random, world: int) -> list[tuple[str, str, list[list[int]]]]:
    """(style, desc, groups as rank lists) for each family drawn."""
    out: list[tuple[str, str, list[list[int]]]] = []
    divs = _divisors(world)
    kinds = ["grid", "strided", "subgroups", "uneven", "subset", "mesh1d"]
    for kind in rng.sample(kinds, rng.choice((0, 1, 1, 2, 2, 3))):
        if kind == "grid" and divs:
            tp = rng.choice(divs)
            mesh = rng.random() < 0.5
            tps = [list(range(i, i + tp)) for i in range(0, world, tp)]
            dps = [list(range(j, world, tp)) for j in range(tp)]
            out.append((MESH if mesh else NEW_GROUP, "mesh_tp" if mesh else "tp", tps))
            out.append((MESH if mesh else NEW_GROUP, "mesh_dp" if mesh else "dp", dps))
        elif kind == "strided" and divs:
            k = rng.choice(divs)
            out.append((NEW_GROUP, rng.choice(("ep", "cp", "strided")), [list(range(i, world, k)) for i in range(k)]))
        elif kind == "subgroups" and divs:
            k = rng.choice(divs)
            out.append((SUBGROUPS, "undefined", [list(range(i, i + k)) for i in range(0, world, k)]))
        elif kind == "uneven" and world >= 3:
            perm = rng.sample(range(world), world) if rng.random() < 0.5 else list(range(world))
            cut = rng.randint(1, world - 1)
            parts = [sorted(perm[:cut]), sorted(perm[cut:])]
            out.append((NEW_GROUP, rng.choice(("dp_shard", "pp")), [p for p in parts if len(p) >= 2] or [sorted(perm)]))
        elif kind == "subset" and world >= 3:
            size = rng.randint(2, world - 1)
            out.append((NEW_GROUP, rng.choice(("expert", "pp_stage", "aux")), [sorted(rng.sample(range(world), size))]))
        elif kind == "mesh1d":
            out.append((DEFAULT, "default_pg", [list(range(world))]))  # DeviceMesh 1-D: the default group
    return out


def random_layout(rng: random.Random, world: int | None = None) -> Layout:
    world = world or _world(rng)
    groups = [Group(0, "0", "default_pg", tuple(range(world)), DEFAULT)]
    families: list[tuple[int, ...]] = [(0,)]
    for style, desc, members in _families(rng, world):
        if style == DEFAULT:
            families.append((0,))
            continue
        idx = []
        for ranks in members:
            g = Group(len(groups), str(len(groups)), desc, tuple(ranks), style)
            groups.append(g)
            idx.append(g.index)
        families.append(tuple(idx))
    return Layout(world, tuple(groups), tuple(families))
