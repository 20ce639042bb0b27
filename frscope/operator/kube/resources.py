"""The resource types the operator reads and writes."""

from __future__ import annotations

from frscope.operator import names
from frscope.operator.kube.api_client import Resource

PODS = Resource("", "v1", "pods", "Pod")
EVENTS = Resource("", "v1", "events", "Event")
PYTORCHJOBS = Resource(names.JOB_GROUP, names.JOB_VERSION, names.JOB_PLURAL, names.JOB_KIND)
REPORTS = Resource(names.REPORT_GROUP, names.REPORT_VERSION, names.REPORT_PLURAL, names.REPORT_KIND)
TOKENREVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)
SUBJECTACCESSREVIEWS = Resource("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview",
                                namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
NODE_LEDGER = Resource(names.REPORT_GROUP, names.REPORT_VERSION, names.NODE_LEDGER_PLURAL, names.NODE_LEDGER_KIND,
                       namespaced=False)
NETWORK_POLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
