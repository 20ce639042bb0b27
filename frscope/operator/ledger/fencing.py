"""Fencing a node the ledger finds ready (opt-in: `--node-fencing cordon`; `dry-run` by default), inside
the action policy's limits (docs/actions.md):

- the cordon budget, `--cordon-max-nodes`: nodes frscope holds at once, cluster-wide, whether fenced
  by the ledger or tainted by a job's `cordon` action;
- a namespace's share of that budget, `--node-fence-namespace-share`: the nodes held by fences that one
  namespace's incidents set off, at most max(1, floor(budget x share)); one tenant never holds it all
  where the budget has room for two;
- the rate limit, `--action-rate`: actions in the namespace of the incident that made the node ready,
  in any hour, counting the actions recorded in that namespace's reports and the ledger's fences
  that incidents there set off;
- never the last healthy nodes of a pool (`--node-fence-keep-healthy`, pools.fence_refusal).

A fence is a cordon (`spec.unschedulable: true`, with the annotation frscope.io/fenced naming the
incident), and with `--node-fence-taint` also frscope's NoSchedule taint. Lifting it is a person's
decision: the ledger notices the node schedulable again and records who (`released`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from frscope.operator import names
from frscope.operator.actions import cordon, record
from frscope.operator.kube import NODES, REPORTS, KubeClient, retry_on_conflict
from frscope.operator.ledger import pools
from frscope.operator.ledger.incident_input import parse_time
from frscope.operator.ledger.ledger_object import HOLDING, LedgerEntry

RATE_WINDOW_S = 3600.0
MODES = ("off", "dry-run", "cordon")


@dataclass(frozen=True, slots=True)
class FencingOptions:
    mode: str = "dry-run"  # off | dry-run | cordon
    taint: bool = False
    keep_healthy: int = 1
    pool_labels: tuple[str, ...] = pools.DEFAULT_POOL_LABELS
    namespace_share: float = 0.5  # of --cordon-max-nodes, for the fences one namespace's incidents set off

    def namespace_budget(self, max_nodes: int) -> int:
        return max(1, math.floor(max_nodes * self.namespace_share))

    def __post_init__(self) -> None:
        if not 0 < self.namespace_share <= 1:
            raise ValueError("--node-fence-namespace-share must be > 0 and <= 1")
        if self.mode not in MODES:
            raise ValueError(f"--node-fencing must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.keep_healthy < 0:
            raise ValueError("--node-fence-keep-healthy must be >= 0")


def held_nodes(entries: Iterable[LedgerEntry], nodes: Iterable[dict[str, Any]]) -> set[str]:
    """Nodes frscope holds now: fenced (or being fenced) by the ledger, or carrying the action's taint."""
    held = {e.node for e in entries if e.fence is not None and e.fence.state in HOLDING}
    return held | {pools.node_name(n) for n in nodes if pools.has_suspect_taint(n)}


def held_from(entries: Iterable[LedgerEntry], namespace: str) -> int:
    """Nodes the ledger holds fenced now that incidents of `namespace` set off."""
    return sum(1 for e in entries if e.fence is not None and e.fence.state in HOLDING
               and e.fence.incident.startswith(f"{namespace}/"))


def fences_from(entries: Iterable[LedgerEntry], namespace: str, since: float) -> int:
    """The ledger's fences (claimed, done or failed) set off by incidents of `namespace` since `since`."""
    count = 0
    for entry in entries:
        fence = entry.fence
        if fence is None or fence.state not in (*HOLDING, "failed", "released"):
            continue
        at = parse_time(fence.at)
        if fence.incident.startswith(f"{namespace}/") and at is not None and at >= since:
            count += 1
    return count


async def refusal(kube: KubeClient, node: str, trigger: str, entries: Sequence[LedgerEntry], *,
                  options: FencingOptions, rate_per_hour: int, max_nodes: int, now: float) -> str | None:
    """Why `node` may not be fenced now (None: it may). `trigger`: the incident's report, namespace/name."""
    nodes = await kube.list(NODES)
    own = next((n for n in nodes if pools.node_name(n) == node), None)
    if own is not None and not pools.is_schedulable(own):
        return f"node {node} is cordoned already (not by frscope)"
    pool = pools.fence_refusal(node, nodes, options.pool_labels, options.keep_healthy)
    if pool is not None:
        return pool
    held = held_nodes(entries, nodes) - {node}
    if len(held) + 1 > max_nodes:
        return f"{len(held)} node(s) already held by frscope (budget --cordon-max-nodes={max_nodes})"
    namespace = trigger.split("/", 1)[0]
    share = options.namespace_budget(max_nodes)
    theirs = held_from([e for e in entries if e.node != node], namespace)
    if theirs + 1 > share:
        return (f"{theirs} node(s) already held by fences that namespace {namespace} set off (its share of the budget: "
                f"{share}, --node-fence-namespace-share={options.namespace_share:g})")
    reports = await kube.list(REPORTS, namespace)
    recent = record.actions_since(reports, now - RATE_WINDOW_S) + fences_from(entries, namespace, now - RATE_WINDOW_S)
    if recent >= rate_per_hour:
        return (f"rate limit: {recent} action(s) in namespace {namespace} in the last hour "
                f"(--action-rate={rate_per_hour})")
    return None


async def cordon_node(kube: KubeClient, node: str, *, trigger: str, evidence: str, taint: bool, now: str
                      ) -> tuple[bool, bool]:
    """Cordon the node (and taint it): (cordoned now, tainted now); False where it already was."""

    async def cycle() -> bool:
        obj = await kube.get(NODES, None, node)
        if not pools.is_schedulable(obj):
            return False
        meta = obj.get("metadata") or {}
        await kube.merge_patch(NODES, None, node, {
            "metadata": {"resourceVersion": meta.get("resourceVersion"),
                         "annotations": {names.ANN_FENCED: trigger}},
            "spec": {"unschedulable": True}})
        return True

    cordoned = await retry_on_conflict(cycle)
    tainted = await cordon.taint_node(kube, node, evidence, now) if taint else False
    return cordoned, tainted


def lifted(entry: LedgerEntry, node: dict[str, Any] | None) -> bool:
    """A person lifted frscope's fence: the node is schedulable again, and frscope's taint is gone."""
    if entry.fence is None or entry.fence.state != "fenced" or node is None:
        return False
    return pools.is_schedulable(node) and not (entry.fence.tainted and pools.has_suspect_taint(node))


# Writers of a node that are not people: frscope, the kubelet, and the node lifecycle controller (which
# removes its `node.kubernetes.io/unschedulable` taint once a node is uncordoned).
SYSTEM_WRITERS = frozenset({names.COMPONENT, "kubelet", "kube-controller-manager", "kube-scheduler"})
NOT_RECORDED = "not recorded (an uncordon leaves no managedFields entry; the API server's audit log has it)"


def released_by(node: dict[str, Any], since: float) -> str:
    """Who last wrote the node's spec or metadata after `since`, as its managedFields name the writer,
    leaving out frscope and the cluster's own components. A writer that only removed fields (`kubectl
    uncordon` does) owns nothing afterwards and has no entry: then it is not recorded."""
    best: tuple[float, str] | None = None
    for item in (node.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(item, dict) or item.get("manager") in SYSTEM_WRITERS or item.get("subresource"):
            continue
        at = parse_time(item.get("time"))
        if at is None or at < since - 1:
            continue
        if best is None or at >= best[0]:
            best = (at, str(item.get("manager") or "")[:256])
    return best[1] if best else NOT_RECORDED
