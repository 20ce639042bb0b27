"""Pods' container statuses -> `RankExit`s, the analysis' evidence of how ranks' processes ended.

The kubelet reports each ended run of the trainer container (`state.terminated` or, after a
restart, `lastState.terminated`): exit code, reason (`OOMKilled`, `Error`), the termination message
(the chart sets `terminationMessagePolicy: FallbackToLogsOnError`, so a crash's last log lines) and
`restartCount`. A pod's ranks are the ones its sidecar delivered; a pod that delivered nothing (it
died) gets the ranks of its place in the job: node rank (Master first, then Workers by index) times
processes per node, as the training operator assigns them.

Under torchrun the container's exit is the agent's: when its message holds the agent's failure summary
(`frscope.records.torchrun_exits`), each rank it lists gets the worker's own exit code and error line
instead, and the pod's other ranks the container's exit.
"""

from __future__ import annotations

from collections.abc import Iterable

from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.model.objects import PodInfo, Termination
from frscope.records import RankExit
from frscope.records.exits import one_line
from frscope.records.torchrun_exits import torchrun_failures


def _ended_run(pod: PodInfo, about: tuple[str, int] | None) -> Termination | None:
    """The end of the pod's current trainer run, if it ended; else the end of the run the incident is
    about (`about`: the signal's pod and run). A previous run's end (`lastState`) is not evidence about
    the run that replaced it: after a restart, its ranks are new processes that may well be alive."""
    current = [t for t in pod.terminations if t.run == pod.run]
    if current:
        return current[0]
    if about is not None and about[0] == pod.name:
        return next((t for t in pod.terminations if t.run == about[1]), None)
    return None


def _node_order(pods: list[PodInfo]) -> dict[str, int]:
    ordered = sorted(pods, key=lambda p: (p.replica_type.lower() != "master", p.replica_index or 0, p.name))
    return {p.name: i for i, p in enumerate(ordered)}


def pod_ranks(pods: list[PodInfo], evidence: dict[str, PodEvidence],
              world_size: int | None) -> dict[str, tuple[int, ...]]:
    """Each pod's global ranks: what its sidecar delivered, else its node rank's block of ranks."""
    per_node = world_size // len(pods) if world_size and pods and world_size % len(pods) == 0 else 1
    order = _node_order(pods)
    out: dict[str, tuple[int, ...]] = {}
    for pod in pods:
        delivered = evidence.get(pod.name)
        if delivered is not None and delivered.ranks:
            out[pod.name] = tuple(sorted(delivered.ranks))
        else:
            first = order[pod.name] * per_node
            out[pod.name] = tuple(range(first, first + per_node))
    return out


def rank_exits(pods: Iterable[PodInfo], evidence: dict[str, PodEvidence],
               world_size: int | None, about: tuple[str, int] | None = None) -> dict[int, RankExit]:
    """`about`: the pod and trainer run the incident's signal names, whose end counts even when that
    pod has restarted since."""
    pod_list = list(pods)
    ranks = pod_ranks(pod_list, evidence, world_size)
    out: dict[int, RankExit] = {}
    for pod in pod_list:
        term = _ended_run(pod, about)
        if term is None:
            continue
        source = f"pod {pod.namespace}/{pod.name} container {term.container} (run {term.run})"
        workers = {f.rank: f for f in torchrun_failures(term.message)}
        for rank in sorted(set(ranks[pod.name]) | set(workers)):
            worker = workers.get(rank)
            if worker is not None:
                out[rank] = RankExit(
                    rank,
                    exit_code=worker.exit_code,
                    reason=term.reason,
                    message=one_line(worker.line or term.message),
                    restart_count=term.run,
                    finished_at_ns=term.finished_at_ns,
                    first_failure=worker.root_cause,
                    source=f"{source}: torchrun's summary, local rank {worker.local_rank}"
                           f"{', the first failure' if worker.root_cause else ''}; container exit code "
                           f"{term.exit_code}",
                )
                continue
            out[rank] = RankExit(
                rank,
                exit_code=term.exit_code,
                reason=term.reason,
                message=one_line(term.message),
                restart_count=term.run,
                finished_at_ns=term.finished_at_ns,
                source=source,
            )
    return out


def ended_runs(pods: tuple[PodInfo, ...]) -> str:
    """The trainer runs that have ended, as known now (pod uid, container, run, exit code), one string:
    it changes when the kubelet reports another end."""
    return ",".join(sorted(f"{p.uid}/{t.container}/{t.run}/{t.exit_code}" for p in pods for t in p.terminations))


def ended_set(pods: tuple[PodInfo, ...]) -> frozenset[str]:
    """`ended_runs` as a set: the ends that one moment knew and another did not."""
    text = ended_runs(pods)
    return frozenset(text.split(",")) if text else frozenset()
