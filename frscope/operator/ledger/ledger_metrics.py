"""The node ledger's Prometheus metrics, on the operator's registry.

`frscope_node_suspicion{node}` has one series per node in the ledger (nodes a diagnosis implicated,
forgotten with their incidents), at most MAX_NODE_SERIES, the highest scores; every other label is a
closed set.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from frscope.analysis.suspicion import EvidenceClass, NodeState

MAX_NODE_SERIES = 500
FENCE_OUTCOMES = ("dry-run", "done", "skipped", "failed", "released")


class LedgerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.suspicion = Gauge(
            "frscope_node_suspicion",
            "The node ledger's suspicion score of each implicated node: its incidents' weights, each halved every "
            "half-life (docs/actions.md, 'The node ledger').",
            ["node"], registry=registry,
        )
        self.incidents = Counter(
            "frscope_node_incidents",
            "Incidents the node ledger recorded against nodes, by evidence class (code and unclear weigh 0).",
            ["evidence"], registry=registry,
        )
        self.nodes = Gauge("frscope_node_ledger_nodes", "Nodes in the node ledger, by state.", ["state"],
                           registry=registry)
        self.fences = Counter(
            "frscope_node_fences",
            "The node ledger's fencing steps, by outcome (dry-run, done, skipped, failed; released: a person "
            "made a fenced node schedulable again).",
            ["outcome"], registry=registry,
        )
        self.unsealed = Counter(
            "frscope_node_reports_unsealed",
            "FlightRecorderReports the node ledger ignored: not sealed by this operator (made or changed by "
            "someone else; docs/install.md, 'Threat model').",
            registry=registry,
        )
        self._shown: set[str] = set()
        for evidence in EvidenceClass:
            self.incidents.labels(evidence=evidence.value)
        for state in NodeState:
            self.nodes.labels(state=state.value).set(0)
        for outcome in FENCE_OUTCOMES:
            self.fences.labels(outcome=outcome)

    def show(self, scores: Mapping[str, float], states: Mapping[str, NodeState]) -> None:
        """The whole ledger as now: scores of its nodes (the highest MAX_NODE_SERIES), nodes per state."""
        top = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_NODE_SERIES]
        shown = {node for node, _ in top}
        for gone in self._shown - shown:
            self.suspicion.remove(gone)
        for node, value in top:
            self.suspicion.labels(node=node).set(value)
        self._shown = shown
        for state in NodeState:
            self.nodes.labels(state=state.value).set(sum(1 for s in states.values() if s is state))

    def one(self, node: str, score: float) -> None:
        """A node's score changed (between two full refreshes)."""
        if node in self._shown or len(self._shown) < MAX_NODE_SERIES:
            self._shown.add(node)
            self.suspicion.labels(node=node).set(score)
