"""Does a NetworkPolicy of the chart let Prometheus in? Pure: policy objects in, verdict out.

The chart's policies admit, on the scrape ports, frscope's own peers (opted-in pods, the operator)
plus the peers of `networkPolicy.prometheus`. A rule that admits frscope's own peers and nobody else
shuts Prometheus out; a rule with no `from` admits everyone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from frscope.operator import names

# frscope's own peers: opted-in pods (the inject label), and the chart's pods (its name, or the component of
# its operator and `helm test` pod). Only the label's value tells them from Prometheus' pods, which the
# chart's default selector names by the same key (app.kubernetes.io/name=prometheus).
_OWN_COMPONENTS = ("operator", "test")


def _own_peer(peer: Mapping[str, Any]) -> bool:
    labels = ((peer.get("podSelector") or {}).get("matchLabels") or {})
    return (names.INJECT_KEY in labels or labels.get("app.kubernetes.io/name") == "frscope"
            or labels.get("app.kubernetes.io/component") in _OWN_COMPONENTS)


def shuts_out_prometheus(policy: Mapping[str, Any]) -> bool:
    """True when a rule admits only frscope's own peers: the port it covers is closed to Prometheus."""
    for rule in (policy.get("spec") or {}).get("ingress") or []:
        peers = rule.get("from") or []
        if peers and any(_own_peer(p) for p in peers) and all(_own_peer(p) for p in peers):
            return True
    return False
