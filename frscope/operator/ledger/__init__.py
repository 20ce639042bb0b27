"""The node ledger (docs/actions.md, "The node ledger"): bad nodes across jobs. One cluster-scoped
FlightRecorderNode per node a diagnosis implicated, a suspicion score from the model in
`frscope.analysis.suspicion`, a Warning Event on a node that becomes suspected, opt-in fencing.

    incident_input   a published report -> the incident as the model reads it (pure)
    ledger_object    the FlightRecorderNode object, built and read back (pure)
    pools            a node's pool and whether fencing it leaves the pool healthy nodes (pure)
    fencing          the fence's limits (budget, rate, pools), the cordon, a person's uncordon
    node_signals     what a node says about itself: its conditions, the kubelet's OOM Events (the only
                     hardware and node-OOM evidence)
    seal             the operator's HMAC on the reports it publishes: the ledger records no other
    ledger_metrics   frscope_node_suspicion{node}, incidents by evidence class, nodes by state, fences
    node_ledger      the sequence: record an incident, fence, refresh (decay, releases, metrics)
"""

from frscope.operator.ledger.fencing import FencingOptions
from frscope.operator.ledger.ledger_metrics import LedgerMetrics
from frscope.operator.ledger.node_ledger import NodeLedger, NodeLedgerOptions
from frscope.operator.ledger.node_signals import SignalOptions
from frscope.operator.ledger.seal import LedgerSeal

__all__ = ["FencingOptions", "LedgerMetrics", "LedgerSeal", "NodeLedger", "NodeLedgerOptions", "SignalOptions"]
