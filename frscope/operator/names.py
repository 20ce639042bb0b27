"""Names frscope's operator writes into the cluster and reads from it: one place, so the docs, the chart
and the tests agree with the code (docs/operator.md lists them)."""

from __future__ import annotations

from typing import Final

# Everything frscope stores on objects it does not own lives under this prefix.
PREFIX: Final = "frscope.io"

# frscope's own CRD (charts/frscope/crds/flightrecorderreport.yaml).
REPORT_GROUP: Final = "frscope.io"
REPORT_VERSION: Final = "v1alpha1"
REPORT_KIND: Final = "FlightRecorderReport"
REPORT_PLURAL: Final = "flightrecorderreports"
# The node ledger's CRD (charts/frscope/crds/flightrecordernode.yaml): cluster-scoped, one per node.
NODE_LEDGER_KIND: Final = "FlightRecorderNode"
NODE_LEDGER_PLURAL: Final = "flightrecordernodes"

# Kubeflow training operator (v1); the other kinds watched are in jobkinds.py.
JOB_GROUP: Final = "kubeflow.org"
JOB_VERSION: Final = "v1"
JOB_KIND: Final = "PyTorchJob"
JOB_PLURAL: Final = "pytorchjobs"
LABEL_JOB_NAME: Final = "training.kubeflow.org/job-name"
LABEL_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
LABEL_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"
# The training operator requires the trainer container to have this name.
TRAINER_CONTAINER: Final = "pytorch"
# Trainer containers by name: the training operator's, and Trainer v2's torch runtime's ("node").
# Pods with neither: every container but frscope's sidecar.
TRAINER_CONTAINERS: Final = frozenset({TRAINER_CONTAINER, "node"})

# frscope writes nothing on the job but its condition (status subresource): the incidents already
# diagnosed and the condition to keep asserted are read back from the job's reports.
# On the report: which job and incident it belongs to.
LABEL_REPORT_JOB: Final = f"{PREFIX}/job"
LABEL_REPORT_INCIDENT: Final = f"{PREFIX}/incident"
# A report's state (its `state.phase`, also this label): an incident's report is Confirmed; a job's
# suspicion report (one per job, `<job>-suspicion`, rewritten at each suspicion) is Suspected, then
# Resumed (the job moved on) or Confirmed (the stall was; the incident's own report has the diagnosis).
# Only Confirmed incident reports are the ledger (a suspicion report says `job.suspicion: true`).
LABEL_REPORT_STATE: Final = f"{PREFIX}/state"
REPORT_STATE_SUSPECTED: Final = "Suspected"
REPORT_STATE_RESUMED: Final = "Resumed"
REPORT_STATE_CONFIRMED: Final = "Confirmed"
SUSPICION_REPORT: Final = "suspicion"

# The condition frscope adds to the job's status.conditions.
CONDITION_TYPE: Final = "CollectiveTimeoutDiagnosed"

# Sidecar injection: opt in with this label (or annotation) set to "true" on the pod template.
INJECT_KEY: Final = f"{PREFIX}/inject"
ANN_INJECTED: Final = f"{PREFIX}/injected"
# The image's own PYTHONPATH (from its ENV), which a container env PYTHONPATH would replace: the webhook
# cannot read images, so the pod template says it, and the bootstrap dir goes in front of it.
ANN_PYTHONPATH: Final = f"{PREFIX}/pythonpath"
SIDECAR_CONTAINER: Final = "frscope-sidecar"
SIDECAR_PORT_NAME: Final = "frscope"
SIDECAR_VOLUME: Final = "frscope"
SIDECAR_TOKEN_VOLUME: Final = "frscope-token"

# Audiences of the service-account tokens between the sidecars and the operator: a token made for one
# direction is refused in the other, and neither is accepted by the API server itself.
AUDIENCE_OPERATOR: Final = "frscope.io/operator"  # what a sidecar presents when it pushes
AUDIENCE_SIDECAR: Final = "frscope.io/sidecar"  # + /<namespace>/<pod>: what the operator presents to a sidecar

# With several operator replicas (serve.leadership): each replica's pod says whether it leads; the chart's
# Service selects the leader's.
LABEL_OPERATOR_ROLE: Final = f"{PREFIX}/operator-role"

# Event source and field manager.
COMPONENT: Final = "frscope-operator"

# Event reasons of frscope's own (the diagnosis Events use the finding's category).
REASON_SIDECARS_UNREACHABLE: Final = "SidecarsUnreachable"
REASON_DIAGNOSIS_INCOMPLETE: Final = "DiagnosisIncomplete"
# A report rewritten with trainer ends the kubelet reported after it was written (controller._revise).
REASON_REVISED: Final = "DiagnosisRevised"
# A stall a sidecar suspects, not yet confirmed (engine/suspicions.py): Warning; the job moving on:
# Normal. A straggler reported by a sidecar: Warning; keeping up again: Normal.
REASON_SUSPECTED: Final = "SuspectedStall"
REASON_RESUMED: Final = "Resumed"
REASON_STRAGGLER: Final = "Straggler"
REASON_STRAGGLER_GONE: Final = "StragglerKeepsUp"
# The condition's reason while a job that was suspected moved on before the stall was confirmed.
CONDITION_REASON_RESUMED: Final = "Resumed"

# Acting on a diagnosis (frscope/operator/actions, docs/actions.md). The policy annotation, on the job
# or on its Namespace (the namespace's default); the value is one of actions.policy.Policy.
ANN_ON_DIAGNOSIS: Final = f"{PREFIX}/on-diagnosis"
# On a job frscope stopped: the verdict that stopped it (one line).
ANN_STOPPED: Final = f"{PREFIX}/stopped-by-diagnosis"
# The taint frscope puts on a suspect node (effect NoSchedule only; the value is the finding's category).
TAINT_SUSPECT: Final = f"{PREFIX}/suspect-node"
# Kueue owns `runPolicy.suspend` of the jobs it queues (it un-suspends an admitted job).
LABEL_KUEUE_QUEUE: Final = "kueue.x-k8s.io/queue-name"

# Event reasons of the actions (job Events, and the node Event of a cordon).
REASON_RESTARTED: Final = "HungJobRestarted"
REASON_STOPPED: Final = "HungJobStopped"
REASON_CORDONED: Final = "SuspectNodeCordoned"
REASON_DRY_RUN: Final = "DiagnosisActionDryRun"
REASON_ACTION_SKIPPED: Final = "DiagnosisActionSkipped"
REASON_ACTION_FAILED: Final = "DiagnosisActionFailed"

# The node ledger (frscope/operator/ledger, docs/actions.md "The node ledger"). On a node the ledger
# cordoned: the report of the incident that made it ready to fence (namespace/name).
ANN_FENCED: Final = f"{PREFIX}/fenced"
# Node Events of the ledger (in `default`, where node Events live).
REASON_NODE_SUSPECTED: Final = "NodeSuspected"
REASON_NODE_FENCED: Final = "SuspectNodeFenced"
REASON_NODE_FENCE_DRY_RUN: Final = "SuspectNodeFenceDryRun"
REASON_NODE_FENCE_SKIPPED: Final = "SuspectNodeFenceSkipped"
REASON_NODE_FENCE_FAILED: Final = "SuspectNodeFenceFailed"
REASON_NODE_RELEASED: Final = "SuspectNodeReleased"
