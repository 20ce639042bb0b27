"""What a hung job costs and what acting saves: its watchdog timeout and its GPUs (pure functions).

The watchdog would end the job `timeout` after the stuck collective began. Acting at `now` saves
`timeout - (stalled for + time since the gather)` of every GPU the job holds:

- timeout: the stuck collective's `timeout_ms` in the recorder (the largest the ranks recorded for its
  group), else the trainer's env (objects.WATCHDOG_TIMEOUT_ENV), else torch's default for the backend
  (10 min for NCCL, 30 min for gloo and others: torch.distributed's default_pg_nccl_timeout and
  default_pg_timeout);
- GPUs: the accelerators the job's pods request (objects.GPU_RESOURCES). A CPU job holds 0 GPUs: the
  report says so and gives rank-seconds instead.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from frscope.analysis import Finding
from frscope.operator.model.objects import WATCHDOG_TIMEOUT_ENV, PodInfo
from frscope.records import DumpSet

DEFAULT_TIMEOUT_S = {"nccl": 600.0}
DEFAULT_OTHER_TIMEOUT_S = 1800.0


@dataclass(frozen=True, slots=True)
class Impact:
    timeout_s: float
    timeout_source: str
    gpus: int
    ranks: int
    culprit_pods: tuple[str, ...]
    culprit_nodes: tuple[str, ...]
    # node -> the culprit ranks that ran there (what the node ledger records on each node).
    culprit_ranks_by_node: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        by_node = {n: list(r[:256]) for n, r in sorted(self.culprit_ranks_by_node.items())[:64]}
        return {"watchdogTimeoutSeconds": self.timeout_s, "timeoutSource": self.timeout_source,
                "gpus": self.gpus, "ranks": self.ranks, "culpritPods": list(self.culprit_pods[:64]),
                "culpritNodes": list(self.culprit_nodes[:64]), "culpritRanksByNode": by_node}


def recorded_timeout_s(dumpset: DumpSet, finding: Finding) -> float | None:
    """The largest `timeout_ms` the ranks recorded for the stuck collective (else any of its group's)."""
    group = finding.process_group.name
    at_seq: list[int] = []
    in_group: list[int] = []
    for dump in dumpset.dumps.values():
        for entry in dump.entries:
            if entry.pg_name != group or not entry.timeout_ms or entry.timeout_ms <= 0:
                continue
            in_group.append(entry.timeout_ms)
            if entry.collective_seq_id == finding.collective_seq_id and not entry.is_p2p:
                at_seq.append(entry.timeout_ms)
    chosen = at_seq or in_group
    return max(chosen) / 1000.0 if chosen else None


def job_timeout(dumpset: DumpSet, finding: Finding, pods: Iterable[PodInfo], backend: str | None,
                default_s: float | None = None) -> tuple[float, str]:
    """(seconds, where that number came from)."""
    recorded = recorded_timeout_s(dumpset, finding)
    if recorded is not None:
        return recorded, "recorder (timeout_ms of the stuck collective)"
    from_env = [p.env_timeout_s for p in pods if p.env_timeout_s]
    if from_env:
        return max(v for v in from_env if v is not None), f"pod env {WATCHDOG_TIMEOUT_ENV}"
    if default_s is not None:
        return default_s, "operator default (--default-watchdog-timeout)"
    value = DEFAULT_TIMEOUT_S.get(backend or "", DEFAULT_OTHER_TIMEOUT_S)
    return value, f"torch's default for {backend or 'an unknown backend'} ({value:.0f} s)"


def culprit_placement(finding: Finding, rank_pods: dict[int, str], pods: Iterable[PodInfo]
                      ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, tuple[int, ...]]]:
    """The pods and the nodes the culprit ranks ran on (sorted, unique), and each node's culprit ranks."""
    nodes = {p.name: p.node for p in pods}
    culprit_pods = sorted({rank_pods[r] for r in finding.culprit_ranks if r in rank_pods})
    culprit_nodes = sorted({nodes[p] for p in culprit_pods if nodes.get(p)})
    by_node: dict[str, list[int]] = {}
    for rank in sorted(set(finding.culprit_ranks)):
        node = nodes.get(rank_pods.get(rank, ""), "")
        if node:
            by_node.setdefault(node, []).append(rank)
    return tuple(culprit_pods), tuple(culprit_nodes), {n: tuple(r) for n, r in by_node.items()}


def parse_time(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Saving:
    seconds: float  # the watchdog's remaining time when frscope acts
    gpu_seconds: float
    rank_seconds: float

    def describe(self, gpus: int) -> str:
        if gpus:
            return f"{self.gpu_seconds:.0f} GPU-seconds saved ({gpus} GPUs x {self.seconds:.0f} s before the watchdog)"
        return (f"0 GPUs held (a CPU job); {self.seconds:.0f} s before the watchdog, "
                f"{self.rank_seconds:.0f} rank-seconds saved")


def saving(impact: dict[str, Any], stalled_for_s: float | None, gathered_at: Any, now: float) -> Saving:
    """What ending the job at `now` saves, from the report's `impact` and diagnosis (durable inputs)."""
    timeout = float(impact.get("watchdogTimeoutSeconds") or 0.0)
    gathered = parse_time(gathered_at)
    since_gather = max(now - gathered, 0.0) if gathered is not None else 0.0
    elapsed = (stalled_for_s or 0.0) + since_gather
    remaining = max(timeout - elapsed, 0.0)
    gpus = int(impact.get("gpus") or 0)
    ranks = int(impact.get("ranks") or 0)
    return Saving(round(remaining, 1), round(remaining * gpus, 1), round(remaining * ranks, 1))
