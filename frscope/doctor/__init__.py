"""`frscope doctor`: checks a cluster's frscope setup against the current kubeconfig, one pass/fail
line per check with what to do (the `linkerd check` of this product). Kubernetes-facing: it may
import `frscope.operator.kube`, `frscope.operator.names` and `frscope.wire`, never the sidecar."""
