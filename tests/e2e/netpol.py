"""Which peers may open which ports of a pod, under a namespace's NetworkPolicies (ingress only), by the rules
of the networking.k8s.io/v1 API reference. The policies come from the real API server (after its defaulting
and validation); what no machine here has is a CNI that enforces them (Debian's CNI plugins do not), so this
reading of the spec stands in for one in the tests, and says so.

- A pod that no policy with Ingress in its policyTypes selects accepts everything.
- Otherwise a connection is allowed when some rule of some selecting policy allows it: a rule without
  `from` admits every peer, one without `ports` every port; a `from` peer with both selectors means pods of
  those namespaces with those labels, a podSelector alone the policy's own namespace, a namespaceSelector
  alone every pod of those namespaces; `endPort` makes a range.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector; {} selects everything."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _peer_matches(peer: Mapping[str, Any], policy_namespace: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # pod-to-pod traffic in these tests; an ipBlock is never meant for pod IPs here
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], source.ns_labels()):
            return False
    elif source.namespace != policy_namespace:
        return False
    return "podSelector" not in peer or selects(peer["podSelector"], source.labels)


def _port_matches(ports: Iterable[Mapping[str, Any]] | None, protocol: str, port: int) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p:
            return True
        low = int(p["port"])
        if low <= port <= int(p.get("endPort", low)):
            return True
    return False


def allowed(policies: Iterable[Mapping[str, Any]], target: Pod, source: Pod, port: int,
            protocol: str = "TCP") -> bool:
    """May `source` open `port` of `target` under these policies (those of target's namespace)?"""
    selecting = [p for p in policies
                 if p["metadata"]["namespace"] == target.namespace
                 and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
                 and selects(p["spec"].get("podSelector"), target.labels)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            if peers and not any(_peer_matches(peer, target.namespace, source) for peer in peers):
                continue
            if _port_matches(rule.get("ports"), protocol, port):
                return True
    return False
