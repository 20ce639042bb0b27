"""The synthetic job's shape: its groups (world, tensor, pipeline and data parallel, DeviceMesh-style
descriptions) and every rank's place in them; the format constants torch 2.13 writes."""


from __future__ import annotations

from dataclasses import dataclass

SHAPES = ("nccl", "gloo")
FORMATS = ("pickle", "json")
SCENARIOS = (
    "healthy",
    "not_joined",
    "type_mismatch",
    "size_mismatch",
    "dtype_mismatch",
    "not_completed",
    "straggler",
    "p2p_mismatch",
    "missing",
    "cross_group",
)
# The finding category (frscope.analysis names) each scenario must produce; None: no finding.
CATEGORY: dict[str, str | None] = {
    "healthy": None,
    "not_joined": "RankNotJoined",
    "type_mismatch": "CollectiveTypeMismatch",
    "size_mismatch": "SizeMismatch",
    "dtype_mismatch": "DtypeMismatch",
    "not_completed": "NotCompleted",
    "straggler": "Straggler",
    "p2p_mismatch": "P2PMismatch",
    "missing": "MissingDumps",
    "cross_group": "NotCompleted",
}
# Where in the step each fault is injected (a position key of the step template).
DEFAULT_POSITION: dict[str, str] = {
    "not_joined": "dp_rs",
    "missing": "dp_rs",
    "type_mismatch": "fwd_ar_{mid}",
    "size_mismatch": "fwd_ar_{mid}",
    "dtype_mismatch": "fwd_ag_{mid}",
    "not_completed": "dp_rs",
    "cross_group": "tp_gnorm",
    "p2p_mismatch": "pp_fwd",
}
DEFAULT_PREFIX = "nccl_trace_rank_"
VERSION = "2.10"
NCCL_VERSION = "2.27.7"

# Roles of process groups. Every rank belongs to exactly one group of each role.
WORLD, TP, PP, DP = 0, 1, 2, 3
ROLE_NAMES = ("world", "tp", "pp", "dp")
ROLE_DESC = ("default_pg", "mesh_tp", "mesh_pp", "mesh_dp")
_ROLE_BY_NAME = {name: index for index, name in enumerate(ROLE_NAMES)}

# Entry state codes used by the simulation.
SCHEDULED, STARTED, COMPLETED = 0, 1, 2
STATE_NAMES = ("scheduled", "started", "completed")

NS_PER_MS = 1_000_000  # ns per ms
NS_PER_S = 1_000_000_000  # ns per s


# ---------------------------------------------------------------------------------------------
# topology


@dataclass(frozen=True, slots=True)
class Topology:
    """world = dp x pp x tp; rank = d * (pp * tp) + p * tp + t (tensor parallel innermost)."""

    world: int
    tp: int
    pp: int
    dp: int

    @classmethod
    def make(cls, world: int, tp: int | None = None, pp: int | None = None, shape: str = "nccl") -> Topology:
        if world < 2:
            raise ValueError("need at least 2 ranks")
        if tp is None:
            tp = 1
            for candidate in (8, 4, 2):
                if world % candidate == 0 and world // candidate >= 2:
                    tp = candidate
                    break
        if world % tp:
            raise ValueError(f"tensor-parallel size {tp} does not divide {world} ranks")
        if pp is None:
            rest = world // tp
            pp = 2 if shape == "nccl" and rest >= 4 and rest % 2 == 0 else 1
        if pp not in (1, 2):
            raise ValueError("pipeline-parallel size must be 1 or 2")
        if shape == "gloo" and pp != 1:
            raise ValueError("gloo records no point-to-point ops: use pp=1 with the gloo shape")
        if world % (tp * pp):
            raise ValueError(f"tp x pp = {tp * pp} does not divide {world} ranks")
        return cls(world, tp, pp, world // (tp * pp))

    @property
    def roles(self) -> tuple[int, ...]:
        return (WORLD, TP, PP, DP) if self.pp > 1 else (WORLD, TP, DP)

    def n_groups(self, role: int) -> int:
        if role == WORLD:
            return 1
        if role == TP:
            return self.world // self.tp
        if role == PP:
            return self.world // self.pp if self.pp > 1 else 0
        return self.world // self.dp

    def group_index(self, role: int, rank: int) -> int:
        if role == WORLD:
            return 0
        if role == TP:
            return rank // self.tp
        d, rest = divmod(rank, self.pp * self.tp)
        p, t = divmod(rest, self.tp)
        if role == PP:
            return d * self.tp + t
        return p * self.tp + t

    def local_rank(self, role: int, rank: int) -> int:
        if role == WORLD:
            return rank
        d, rest = divmod(rank, self.pp * self.tp)
        p, t = divmod(rest, self.tp)
        return t if role == TP else p if role == PP else d

    def members(self, role: int, index: int) -> tuple[int, ...]:
        """Global ranks of a group, in group-local rank order."""
        block = self.pp * self.tp
        if role == WORLD:
            return tuple(range(self.world))
        if role == TP:
            return tuple(range(index * self.tp, (index + 1) * self.tp))
        if role == PP:
            d, t = divmod(index, self.tp)
            return tuple(d * block + p * self.tp + t for p in range(self.pp))
        p, t = divmod(index, self.tp)
        return tuple(d * block + p * self.tp + t for d in range(self.dp))

    def group_name(self, role: int, index: int) -> str:
        """Names as `new_group` hands them out: a global counter, in creation order tp, pp, dp."""
        if role == WORLD:
            return "0"
        if role == TP:
            return str(1 + index)
        n_tp = self.world // self.tp
        if role == PP:
            return str(1 + n_tp + index)
        return str(1 + n_tp + self.n_groups(PP) + index)

    def local_uid(self, role: int) -> int:
        """The rank-local ProcessGroupNCCL uid (`pg_id`, `pg_status` key): creation order."""
        return self.roles.index(role)
