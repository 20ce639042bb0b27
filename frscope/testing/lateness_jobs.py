"""Simulated lockstep jobs for the lateness-across-pods tests and the operator's cost benchmark: what
each pod's sidecar would report (`frscope.analysis.pod_lateness.RankArrivals`), each pod on its own
clock, with or without recorded waits, and the true answer.

Each step every rank computes (its period x its slowness factor, with jitter), then enters the step's
collectives in order: first its subgroup's (when the layout has subgroups), then the world's. A
collective ends for all its members at one true moment (its last member's arrival plus the transfer);
a member's next collective, or its next step's compute, starts there. A rank's recorded enqueue time is
the true time plus its pod's clock offset; its recorded wait (NCCL with timing) is the end minus its
arrival.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

WORLD = "0"


@dataclass(slots=True)
class LatenessJob:
    pods: dict[str, tuple[int, ...]]  # pod -> its ranks
    period_s: float
    steps: int
    slow: dict[int, float] = field(default_factory=dict)  # rank -> compute factor (1.2: 20% slower)
    jitter: float = 0.03  # standard deviation of each compute, as a fraction of it
    offsets_s: dict[str, float] = field(default_factory=dict)  # pod -> its clock minus the true time
    waits: bool = False  # the recorders date waits (NCCL with timing)
    subgroups: int = 0  # 0: the world group only; k: also k groups across pods (ranks with equal index mod k)
    transfer_s: float = 0.001
    seed: int = 0
    start_ns: int = 1_700_000_000 * 10**9


def simulate(job: LatenessJob) -> dict[str, dict[int, dict[str, list[tuple[int, ...]]]]]:
    """pod -> rank -> group -> [(seq, enqueue ns on the pod's clock[, wait ns])], oldest first."""
    rng = random.Random(job.seed)
    ranks = sorted(r for members in job.pods.values() for r in members)
    pod_of = {r: pod for pod, members in job.pods.items() for r in members}
    groups: list[tuple[str, list[int]]] = []
    if job.subgroups:
        for k in range(job.subgroups):
            members = [r for r in ranks if r % job.subgroups == k]
            if len(members) >= 2:
                groups.append((f"dp{k}", members))
    groups.append((WORLD, ranks))
    free = {r: 0.0 for r in ranks}  # when each rank is next free (true seconds since the start)
    out: dict[str, dict[int, dict[str, list[tuple[int, ...]]]]] = {
        pod: {r: {} for r in members} for pod, members in job.pods.items()}
    seqs = {name: 0 for name, _m in groups}
    for _step in range(job.steps):
        for r in ranks:
            compute = job.period_s * job.slow.get(r, 1.0)
            free[r] += max(0.0, compute * (1 + rng.gauss(0.0, job.jitter)))
        for name, members in groups:
            seqs[name] += 1
            end = max(free[r] for r in members) + job.transfer_s
            for r in members:
                pod = pod_of[r]
                created = job.start_ns + int((free[r] + job.offsets_s.get(pod, 0.0)) * 1e9)
                row: tuple[int, ...] = (seqs[name], created)
                if job.waits:
                    row = (*row, int((end - free[r]) * 1e9))
                out[pod][r].setdefault(name, []).append(row)
                free[r] = end
    return out


def one_rank_per_pod(world: int) -> dict[str, tuple[int, ...]]:
    return {f"train-worker-{r}": (r,) for r in range(world)}


def pods_of(world: int, per_pod: int) -> dict[str, tuple[int, ...]]:
    return {f"train-worker-{p}": tuple(range(p * per_pod, (p + 1) * per_pod)) for p in range(world // per_pod)}


def newest(arrivals: Mapping[str, Mapping[int, Mapping[str, list[tuple[int, ...]]]]], keep: int
           ) -> dict[str, dict[int, dict[str, list[tuple[int, ...]]]]]:
    """Each rank's newest `keep` arrivals per group (what a status answer carries)."""
    return {pod: {r: {g: list(rows[-keep:]) for g, rows in by_group.items()} for r, by_group in by_rank.items()}
            for pod, by_rank in arrivals.items()}
