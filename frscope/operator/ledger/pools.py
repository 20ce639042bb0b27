"""Which nodes form a pool, and whether fencing one would leave its pool without healthy nodes. Pure
functions over Node objects (as JSON).

A node's pool is the value of the first pool label it carries (`--node-pool-labels`, e.g.
`cloud.google.com/gke-nodepool`); nodes with none of them form one pool together. Healthy: Ready,
schedulable, and not carrying frscope's suspect taint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from frscope.operator import names

DEFAULT_POOL_LABELS: tuple[str, ...] = (
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "node.kubernetes.io/instance-type",
)


def node_name(node: dict[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name") or "")


def pool_of(node: dict[str, Any], labels: Sequence[str]) -> str:
    """'label=value' of the first pool label the node carries; '' when it carries none."""
    own = (node.get("metadata") or {}).get("labels")
    own = own if isinstance(own, dict) else {}
    for label in labels:
        value = own.get(label)
        if isinstance(value, str) and value:
            return f"{label}={value}"
    return ""


def has_suspect_taint(node: dict[str, Any]) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return any(isinstance(t, dict) and t.get("key") == names.TAINT_SUSPECT for t in taints)


def is_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_schedulable(node: dict[str, Any]) -> bool:
    return not (node.get("spec") or {}).get("unschedulable")


def healthy(node: dict[str, Any]) -> bool:
    return is_ready(node) and is_schedulable(node) and not has_suspect_taint(node)


def fence_refusal(target: str, nodes: Iterable[dict[str, Any]], labels: Sequence[str], keep: int) -> str | None:
    """Why fencing `target` would take too much of its pool (None: it would not). `keep`: other healthy
    nodes of the pool that must remain."""
    listed = list(nodes)
    own = next((n for n in listed if node_name(n) == target), None)
    if own is None:
        return f"node {target} does not exist"
    pool = pool_of(own, labels)
    others = [n for n in listed if node_name(n) != target and pool_of(n, labels) == pool and healthy(n)]
    if len(others) < keep:
        where = f"pool {pool}" if pool else "the nodes without a pool label"
        return (f"fencing {target} would leave {len(others)} other healthy node(s) in {where} "
                f"(--node-fence-keep-healthy={keep})")
    return None
