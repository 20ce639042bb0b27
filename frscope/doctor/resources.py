"""The resource types doctor reads (beyond the operator's own, in frscope.operator.kube.resources)."""

from __future__ import annotations

from frscope.operator.kube.api_client import Resource

DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
SERVICES = Resource("", "v1", "services", "Service")
SECRETS = Resource("", "v1", "secrets", "Secret")
ENDPOINTSLICES = Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
NETWORKPOLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
WEBHOOKS = Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                    "MutatingWebhookConfiguration", namespaced=False)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                namespaced=False)
TRAINJOBS = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")

# What the chart puts on everything it installs.
CHART_SELECTOR = "app.kubernetes.io/name=frscope"
OPERATOR_SELECTOR = f"{CHART_SELECTOR},app.kubernetes.io/component=operator"
