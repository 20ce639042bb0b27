"""Fencing a suspect node: a NoSchedule taint (never NoExecute: running pods stay) and a node Event,
only when the reports of at least `min_jobs` different jobs blamed that node within `window_s`, and
while fewer than `max_nodes` nodes carry frscope's taint (a cluster-wide budget).

The blames are read from the FlightRecorderReports themselves (`impact.culpritNodes` of a verdict
that points at hardware or the network): durable, and the same evidence a person reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from frscope.operator import names
from frscope.operator.actions.impact import parse_time
from frscope.operator.actions.policy import NODE_CATEGORIES
from frscope.operator.kube import EVENTS, NODES, REPORTS, AlreadyExists, KubeClient, retry_on_conflict
from frscope.operator.model.objects import JobRef
from frscope.operator.publish import build_event


@dataclass(frozen=True, slots=True)
class CordonOptions:
    min_jobs: int = 2
    window_s: float = 3600.0
    max_nodes: int = 1


def blaming_jobs(reports: Iterable[dict[str, Any]], node: str, since: float) -> set[str]:
    """Uids of the jobs whose clear, node-pointing reports since `since` name `node`."""
    jobs: set[str] = set()
    for report in reports:
        what = (report.get("diagnosis") or {}).get("what") or {}
        impact = report.get("impact") or {}
        job = report.get("job") or {}
        if what.get("category") not in NODE_CATEGORIES or what.get("ambiguous"):
            continue
        if node not in (impact.get("culpritNodes") or []):
            continue
        at = parse_time(job.get("gatheredAt"))
        if at is None or at < since:
            continue
        jobs.add(str(job.get("uid") or report.get("metadata", {}).get("name")))
    return jobs


def has_taint(node: dict[str, Any]) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return any(isinstance(t, dict) and t.get("key") == names.TAINT_SUSPECT for t in taints)


async def reports_for(kube: KubeClient, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every report the operator may read: cluster-wide, or in each watched namespace."""
    if not namespaces:
        return await kube.list(REPORTS, None)
    out: list[dict[str, Any]] = []
    for namespace in namespaces:
        out.extend(await kube.list(REPORTS, namespace))
    return out


def fenced_by_ledger(node: dict[str, Any]) -> bool:
    """Cordoned by the node ledger (frscope/operator/ledger): unschedulable with its annotation."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return bool((node.get("spec") or {}).get("unschedulable")) and names.ANN_FENCED in annotations


async def tainted_nodes(kube: KubeClient) -> list[str]:
    """Nodes frscope holds: its taint (this action), or the node ledger's cordon. One budget for both."""
    return sorted(str((n.get("metadata") or {}).get("name")) for n in await kube.list(NODES)
                  if has_taint(n) or fenced_by_ledger(n))


async def taint_node(kube: KubeClient, node: str, category: str, now: str) -> bool:
    """Add frscope's NoSchedule taint (read-modify-write, resourceVersion). False: it was there already."""

    async def cycle() -> bool:
        obj = await kube.get(NODES, None, node)
        if has_taint(obj):
            return False
        spec = obj.get("spec") or {}
        taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
        taints.append({"key": names.TAINT_SUSPECT, "value": category, "effect": "NoSchedule", "timeAdded": now})
        patch = {"metadata": {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")},
                 "spec": {"taints": taints}}
        await kube.merge_patch(NODES, None, node, patch)
        return True

    return await retry_on_conflict(cycle)


async def post_node_event(kube: KubeClient, node: str, *, message: str, incident: str, now: str,
                          instance: str) -> None:
    """A Warning Event on the Node (in 'default', where node Events live), naming the job and finding."""
    obj = await kube.get(NODES, None, node)
    ref = JobRef(namespace="default", name=node, uid=str((obj.get("metadata") or {}).get("uid") or ""),
                 api_version="v1", kind="Node")
    event = build_event(ref, reason=names.REASON_CORDONED, message=message, incident=incident, now=now,
                        instance=instance)
    event["involvedObject"]["namespace"] = ""
    try:
        await kube.create(EVENTS, "default", event)
    except AlreadyExists:
        pass
