"""The last (hung) step simulated rank by rank with a scenario's fault injected (`make_plan`): NCCL enqueues
asynchronously until a CPU sync point and runs each rank's ops in order on one stream; gloo blocks in
every op."""


from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from frscope.testing.synthetic.plan import GroundTruth, Plan
from frscope.testing.synthetic.steps import USER_FRAMES, OpSpec, step_template
from frscope.testing.synthetic.topology import (
    CATEGORY,
    COMPLETED,
    DEFAULT_POSITION,
    DP,
    NS_PER_MS,
    NS_PER_S,
    PP,
    ROLE_DESC,
    SCENARIOS,
    SCHEDULED,
    SHAPES,
    STARTED,
    Topology,
)


@dataclass
class _Faults:
    stop: dict[int, int] = field(default_factory=dict)  # rank -> first position its CPU never enqueues
    skip: set[tuple[int, int]] = field(default_factory=set)  # (rank, position) the CPU skips
    hang: set[tuple[int, int]] = field(default_factory=set)  # (group index, position): never completes
    cut: int | None = None  # healthy: positions >= cut not reached yet
    in_flight: int = 0  # healthy NCCL: the last N reached positions are still running (young)


def _simulate(topo: Topology, templates: list[list[OpSpec]], shape: str,
              faults: _Faults) -> dict[int, tuple[tuple[int, int], ...]]:
    """Which positions of the last step each rank enqueued, and how far each got."""
    world = topo.world
    n_pos = len(templates[0])
    end = n_pos if faults.cut is None else faults.cut
    gloo = shape == "gloo"
    cpu_ok = [True] * world
    gpu_ok = [True] * world
    records: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    stop = faults.stop
    for pos in range(end):
        spec0 = templates[0][pos]
        role = spec0.role
        sync = gloo or spec0.sync_after
        enq = [cpu_ok[r] and pos < stop.get(r, n_pos) and (r, pos) not in faults.skip for r in range(world)]
        started = [enq[r] and gpu_ok[r] for r in range(world)]
        completed = [False] * world
        for index in range(topo.n_groups(role)):
            members = topo.members(role, index)
            if (index, pos) in faults.hang:
                continue
            if all(started[m] for m in members):
                for m in members:
                    completed[m] = True
        if faults.cut is not None and pos >= end - faults.in_flight:
            in_flight_first = pos == end - faults.in_flight
            for r in range(world):
                completed[r] = False
                if not in_flight_first:
                    started[r] = False
        for r in range(world):
            if not enq[r]:
                continue
            code = COMPLETED if completed[r] else STARTED if started[r] else SCHEDULED
            records[r].append((pos, code))
            if not completed[r]:
                gpu_ok[r] = False
                if sync:
                    cpu_ok[r] = False
    interned: dict[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]] = {}
    out: dict[int, tuple[tuple[int, int], ...]] = {}
    for r in range(world):
        key = tuple(records[r])
        out[r] = interned.setdefault(key, key)
    return out


# ---------------------------------------------------------------------------------------------
# building a plan


def make_plan(
    ranks: int,
    *,
    entries: int = 2000,
    shape: str = "nccl",
    scenario: str = "healthy",
    seed: int = 0,
    culprit: int | None = None,
    position: str | None = None,
    tp: int | None = None,
    pp: int | None = None,
    layers: int = 8,
    straggle_ms: float = 250.0,
    clock_skew_ms: float = 0.0,
    wrap: bool = True,
    now_ns: int | None = None,
    hang_age_s: float | None = None,
) -> Plan:
    """Decide the job, the fault and the timeline; `Plan.dump(rank)` then builds any rank's recorder."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}")
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}")
    if entries < 1:
        raise ValueError("entries must be >= 1")
    topo = Topology.make(ranks, tp, pp, shape)
    gloo = shape == "gloo"
    if scenario == "p2p_mismatch" and (gloo or topo.pp < 2):
        raise ValueError("p2p_mismatch needs the NCCL shape and pipeline parallelism (pp=2)")
    if scenario == "cross_group" and topo.tp < 2:
        raise ValueError("cross_group needs tensor parallelism (tp >= 2)")
    rng = random.Random(seed)
    templates = [step_template(topo, shape, layers, stage) for stage in range(topo.pp)]
    n_pos = len(templates[0])
    keys = [spec.key for spec in templates[0]]
    now = time.time_ns() if now_ns is None else now_ns
    timeout_ms = 1_800_000 if gloo else 600_000
    step_ns = (400 if gloo else 1200) * NS_PER_MS
    offsets = [int(pos * 0.85 * step_ns / n_pos) for pos in range(n_pos)]
    if hang_age_s is None:
        hang_age_s = 120.0 if gloo else timeout_ms / 1000 + 5
    hang_age = int(hang_age_s * NS_PER_S)

    k = culprit if culprit is not None else rng.randrange(1, ranks)
    if not 0 <= k < ranks:
        raise ValueError(f"culprit rank {k} is not in 0..{ranks - 1}")
    pos_key = position or DEFAULT_POSITION.get(scenario, "")
    pos_key = pos_key.replace("{mid}", str(layers // 2))
    faults = _Faults()
    overrides: dict[int, dict[int, OpSpec]] = {}
    straggle: dict[int, int] = {}
    unretired: set[int] = set()
    missing: set[int] = set()
    truth_kw: dict[str, Any] = {}

    p = -1
    if scenario not in ("healthy", "straggler"):
        if pos_key not in keys:
            raise ValueError(f"position {pos_key!r} is not in the step: {keys}")
        p = keys.index(pos_key)
    spec_p = templates[0][p] if p >= 0 else None

    def group_of(role: int, rank: int) -> tuple[int, tuple[int, ...], str]:
        index = topo.group_index(role, rank)
        return index, topo.members(role, index), topo.group_name(role, index)

    def seq_at(pos: int) -> int:
        """collective (or p2p) sequence id of the last step's op at `pos` on an undisturbed rank."""
        spec = templates[0][pos]
        per_step = sum(1 for s in templates[0] if s.role == spec.role and s.is_p2p == spec.is_p2p)
        before = sum(1 for s in templates[0][:pos] if s.role == spec.role and s.is_p2p == spec.is_p2p)
        return full_steps * per_step + before + 1

    # Steps before the last one: enough that the ring buffer wrapped (sequence ids do not start at 1).
    extra = 40 if wrap else 0
    full_steps = math.ceil(entries / n_pos) + extra if wrap else max(0, entries // n_pos - 1)

    if scenario in ("healthy", "straggler"):
        cut = max(1, n_pos - 7)  # somewhere in the backward pass, before the grad-norm sync
        faults.cut = cut
        faults.in_flight = 0 if gloo else 2
        last_pos = cut - 1
        if gloo:
            unretired.add(0)
        if scenario == "straggler":
            straggle[k] = int(straggle_ms * NS_PER_MS)
            truth_kw.update(culprit_ranks=(k,), straggle_ms=straggle_ms,
                            description=f"rank {k} enqueues every collective ~{straggle_ms:g} ms after the others")
        else:
            truth_kw.update(culprit_ranks=(), description="a healthy job: nothing is stuck")
        first_step = now - (full_steps * step_ns) - offsets[last_pos] - 5 * NS_PER_MS - straggle.get(k, 0)
    else:
        assert spec_p is not None
        role = spec_p.role
        index, members, name = group_of(role, k)
        first_step = now - hang_age - offsets[p] - full_steps * step_ns
        truth_kw.update(group_name=name, group_desc=ROLE_DESC[role], group_ranks=members,
                        op=spec_p.op)
        if spec_p.is_p2p:
            truth_kw["p2p_seq_id"] = seq_at(p)
        else:
            truth_kw["collective_seq_id"] = seq_at(p)
        if scenario in ("not_joined", "missing"):
            faults.stop[k] = p
            truth_kw.update(culprit_ranks=(k,))
            if scenario == "missing":
                missing.add(k)
                truth_kw.update(missing_ranks=(k,),
                                description=f"rank {k} died before {spec_p.op} in group {name}; it left no dump")
            else:
                truth_kw.update(description=f"rank {k} never enqueued {spec_p.op} in group {name}")
        elif scenario in ("type_mismatch", "size_mismatch", "dtype_mismatch"):
            faults.hang.add((index, p))
            spec_k = templates[topo.local_rank(PP, k) if topo.pp > 1 else 0][p]
            if scenario == "type_mismatch":
                other = "broadcast" if spec_k.op != "broadcast" else "all_reduce"
                odd = OpSpec(spec_k.key, spec_k.role, other, spec_k.in_sizes, spec_k.in_dtypes,
                             spec_k.in_sizes, spec_k.in_dtypes, spec_k.site + "_odd"
                             if spec_k.site + "_odd" in USER_FRAMES else spec_k.site,
                             spec_k.autograd, spec_k.sync_after, spec_k.dur_ms)
                what = f"rank {k} called {other} where the others called {spec_k.op}"
            elif scenario == "size_mismatch":
                in_sizes = tuple(s[:-1] + (max(1, s[-1] // 2),) for s in spec_k.in_sizes)
                out_sizes = tuple(s[:-1] + (max(1, s[-1] // 2),) for s in spec_k.out_sizes)
                odd = OpSpec(spec_k.key, spec_k.role, spec_k.op, in_sizes, spec_k.in_dtypes, out_sizes,
                             spec_k.out_dtypes, spec_k.site, spec_k.autograd, spec_k.sync_after, spec_k.dur_ms)
                what = f"rank {k} passed {[list(s) for s in in_sizes]} where the others passed " \
                       f"{[list(s) for s in spec_k.in_sizes]}"
            else:
                new = "Float" if spec_k.in_dtypes[0] != "Float" else "BFloat16"
                odd = OpSpec(spec_k.key, spec_k.role, spec_k.op, spec_k.in_sizes, (new,) * len(spec_k.in_dtypes),
                             spec_k.out_sizes, (new,) * len(spec_k.out_dtypes), spec_k.site, spec_k.autograd,
                             spec_k.sync_after, spec_k.dur_ms)
                what = f"rank {k} passed {new} where the others passed {spec_k.in_dtypes[0]}"
            overrides[k] = {p: odd}
            truth_kw.update(culprit_ranks=(k,), description=f"{what} (group {name}); every rank hangs in it")
        elif scenario in ("not_completed", "cross_group"):
            faults.hang.add((index, p))
            truth_kw.update(culprit_ranks=members)
            if scenario == "cross_group":
                consequences = sorted({topo.group_name(DP, topo.group_index(DP, m)) for m in members},
                                      key=int) + ["0"]
                truth_kw.update(
                    consequence_groups=tuple(consequences),
                    description=f"{spec_p.op} in tensor-parallel group {name} (ranks {list(members)}, "
                                f"rank {k} among them) never completed; those ranks never reach the "
                                "data-parallel collective after it, so their DP groups and the world group "
                                "hang too. The root is the TP group.",
                )
            else:
                truth_kw.update(description=f"every rank of group {name} started {spec_p.op}, none completed")
        elif scenario == "p2p_mismatch":
            a, b = members[0], members[1]
            faults.skip.add((b, p))
            # b is the one whose program diverged (it skipped the recv and went on to its own send);
            # a, blocked in its send, is the victim.
            truth_kw.update(culprit_ranks=(b,),
                            description=f"rank {a} sends to rank {b} (group {name}), rank {b} never posts "
                                        "the matching recv")
    truth = GroundTruth(
        scenario=scenario,
        shape=shape,
        world_size=ranks,
        tp=topo.tp,
        pp=topo.pp,
        dp=topo.dp,
        category=CATEGORY[scenario],
        **truth_kw,
    )
    last_step = _simulate(topo, templates, shape, faults)
    skew: dict[int, int] = {}
    if clock_skew_ms:
        for host in range((ranks + 7) // 8):
            skew[host] = int(rng.uniform(-clock_skew_ms, clock_skew_ms) * NS_PER_MS)
    return Plan(
        topo=topo,
        shape=shape,
        entries=entries,
        truth=truth,
        templates=templates,
        full_steps=full_steps,
        last_step=last_step,
        overrides=overrides,
        step_ns=step_ns,
        offsets_ns=offsets,
        first_step_ns=first_step,
        straggle_ns=straggle,
        skew_ns=skew,
        unretired=frozenset(unretired),
        missing=frozenset(missing),
        timeout_ms=timeout_ms,
        seed=seed,
    )


# ---------------------------------------------------------------------------------------------
# writing
