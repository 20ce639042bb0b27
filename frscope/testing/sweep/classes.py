"""The sweep's fault classes: what each injects, what a right verdict is, and why some cannot be decided.

A class is a recipe for the rank program (`rank.py` reads the class name and its drawn parameters) plus
the scoring rule: the categories that count as right for the injected culprits, per capture form. No torch
here: the controller, the scorer and the report import this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# Categories, spelled as frscope.analysis.Category values (strings: the scorer compares the JSON).
NOT_JOINED = "RankNotJoined"
TYPE = "CollectiveTypeMismatch"
SIZE = "SizeMismatch"
DTYPE = "DtypeMismatch"
P2P = "P2PMismatch"
STOPPED = "RankStopped"
MISSING = "MissingDumps"
STRAGGLER = "Straggler"

FORMS = ("snapshot", "pickle", "json")
LAYOUTS = ("default", "grid", "strided", "hsdp", "pipeline")


@dataclass(frozen=True)
class FaultClass:
    name: str
    summary: str
    # Right categories for the first finding; `with_exits` replaces them when exit codes are passed.
    accepted: tuple[str, ...]
    with_exits: tuple[str, ...] | None = None
    # Forms where the evidence cannot single out the culprits (an ambiguous answer with at most twice the
    # culprits as candidates counts as right there), and why.
    undecidable: dict[str, str] = field(default_factory=dict)
    # "settle": the job ends blocked or idle, captured once it stops moving. "poll": ranks exit; the
    # capture is what a sidecar polling every POLL_S kept, plus the dumps the ranks wrote as they failed.
    collect: Literal["settle", "poll"] = "settle"
    min_world: int = 2
    max_world: int = 8
    layouts: tuple[str, ...] = ("default", "grid", "strided", "hsdp")
    culprits: int = 1
    # Sensitive to machine load (lateness measured in ms): kept out of the CI sample.
    timing: bool = False
    # Also right in the forms without live stacks (pickle, JSON), where the evidence says less.
    no_stacks_accepted: tuple[str, ...] = ()
    # Exit codes mean something here (ranks exit): the sweep passes them for about half of the jobs.
    exits: bool = False


_NO_STACKS = ("pickle", "json")
P2P_WHY = ("gloo records no point-to-point op: without live stacks only the ranks missing from the next "
            "collective show, and the recorder cannot tell which of them started the deadlock")

CLASSES: dict[str, FaultClass] = {c.name: c for c in (
    FaultClass("healthy", "jitter, several groups, every op type; no fault", (), layouts=LAYOUTS),
    FaultClass("hang", "a rank stuck in a Python function before one of the step's collectives", (NOT_JOINED,),
               layouts=LAYOUTS),
    FaultClass("hang-strided", "a rank stuck before its strided subgroup's collective", (NOT_JOINED,),
               min_world=4, layouts=("strided",)),
    FaultClass("two-hang", "two ranks of one node stuck at once", (NOT_JOINED,), min_world=4, culprits=2),
    # Its later collectives pair with the others' earlier ones: where those differ in kind, a type mismatch
    # at the skipped one names the same rank.
    FaultClass("skip", "a rank skips one collective of a step and goes on", (NOT_JOINED, TYPE)),
    FaultClass("cycle", "a rank skips its subgroup's collective and waits in the default group's: a cycle",
               (NOT_JOINED,), min_world=4, layouts=("strided", "grid")),
    FaultClass("order", "a rank calls the default group's collective before its subgroup's (the others the "
               "other way round)", (NOT_JOINED,), min_world=4, layouts=("strided", "grid")),
    FaultClass("type", "a rank calls broadcast where the others call all_reduce", (TYPE,), min_world=3),
    FaultClass("size", "a rank passes another shape with the same bytes (all_reduce, all_gather, "
               "reduce_scatter; subgroups too)", (SIZE,), min_world=3),
    FaultClass("dtype", "a rank passes int32 where the others pass float32 (same bytes)", (DTYPE,), min_world=3),
    FaultClass("a2a", "all_to_all_single whose split sizes do not balance on one rank: one element more for "
               "the first rank (it aborts) or one fewer (it waits; half of the jobs)",
               (SIZE,), collect="poll", min_world=4, layouts=("default",)),
    FaultClass("barrier", "uneven data: a rank calls barrier where the others all_reduce", (TYPE, NOT_JOINED),
               min_world=3, layouts=("default",)),
    FaultClass("p2p", "two ranks both recv from each other first (a p2p deadlock, unrecorded by gloo)",
               (P2P,), undecidable={f: P2P_WHY for f in _NO_STACKS}, no_stacks_accepted=(NOT_JOINED,),
               min_world=3, culprits=2,
               layouts=("default",)),
    FaultClass("pipeline", "a pipeline stage stuck before its recv: the later stages wait one behind the other",
               (P2P, NOT_JOINED), undecidable={f: P2P_WHY for f in _NO_STACKS}, min_world=3,
               layouts=("pipeline",)),
    FaultClass("async", "async bucketed all_reduces: a rank stuck before issuing its buckets", (NOT_JOINED,),
               layouts=("default",)),
    FaultClass("gil", "a rank holding the GIL in a C call (a pathological regex): its stacks never answer",
               (NOT_JOINED, MISSING), layouts=("default", "grid")),
    FaultClass("crash", "a rank raises (exit 1) or is OOM-killed; its peers dump as they fail",
               (STOPPED, NOT_JOINED, MISSING), with_exits=(STOPPED,), collect="poll", exits=True,
               layouts=("default", "grid", "strided")),
    FaultClass("stale", "a crashed rank that left a stale periodic dump", (STOPPED,), collect="poll",
               exits=True, layouts=("default", "grid")),
    FaultClass("timeout", "a rank stuck in Python; the others hit the collective timeout and exit, then the "
               "launcher kills it", (NOT_JOINED, STOPPED, MISSING), with_exits=(NOT_JOINED, STOPPED),
               collect="poll", exits=True, layouts=("default", "grid")),
    FaultClass("early-exit", "uneven data: a rank finishes its loop early and exits 0", (STOPPED, NOT_JOINED,
               MISSING), with_exits=(STOPPED, NOT_JOINED), collect="poll", exits=True, layouts=("default",)),
    FaultClass("teardown", "at the end every rank calls barrier, then destroy_process_group; one rank goes "
               "straight to teardown and is stuck there (joining its workers); gloo then fails the others' barrier "
               "and they exit", (NOT_JOINED,), collect="poll", exits=True, layouts=("default",)),
    FaultClass("after-timeout", "a rank stuck in Python; every dump taken after the others' collective timed out",
               (NOT_JOINED,), layouts=("default",)),
    FaultClass("straggler", "a rank late at every collective", (STRAGGLER,), timing=True),
    FaultClass("straggler-steps", "a rank late at every step's first collective", (STRAGGLER,), timing=True,
               layouts=("default",)),
    FaultClass("straggler-2", "a 2-rank job where one rank is late at every collective", (STRAGGLER,),
               timing=True, max_world=2, layouts=("default",)),
    FaultClass("straggler-tp", "a compute straggler in a 2x2 dp x tp job: its tp peer inherits the lateness",
               (STRAGGLER,), timing=True, min_world=4, max_world=4, layouts=("grid",)),
)}
