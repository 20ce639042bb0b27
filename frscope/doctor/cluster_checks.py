"""Checks of what the chart installs: versions, the operator, the webhook, the CRD, NetworkPolicies."""

from __future__ import annotations

import base64
import binascii

from frscope.doctor import certs, versions
from frscope.doctor.crd_schema import stale_schema
from frscope.doctor.policies import shuts_out_prometheus
from frscope.doctor.resources import (
    CHART_SELECTOR,
    CRDS,
    DEPLOYMENTS,
    ENDPOINTSLICES,
    NETWORKPOLICIES,
    OPERATOR_SELECTOR,
    SECRETS,
    SERVICES,
    WEBHOOKS,
)
from frscope.doctor.result import CheckResult, failed, passed
from frscope.operator import names
from frscope.operator.kube.api_client import KubeClient
from frscope.operator.kube.api_errors import NotFound

HELM_INSTALL = "helm install frscope charts/frscope -n frscope-system --create-namespace (docs/install.md)"


async def kubernetes_version(client: KubeClient) -> CheckResult:
    version = await client.server_version()
    text = f"{version[0]}.{version[1]}"
    if versions.kubernetes_tested(version):
        return passed("kubernetes-version", f"Kubernetes {text} is tested")
    if versions.kubernetes_between_tested(version):
        return passed("kubernetes-version", f"Kubernetes {text} is between tested versions ({versions.tested_text()})")
    return failed("kubernetes-version", f"Kubernetes {text} is not among the tested versions "
                  f"({versions.tested_text()})", "see README.md, Supported versions; it may work, untested")


async def operator_available(client: KubeClient) -> CheckResult:
    deployments = await client.list(DEPLOYMENTS, None, label_selector=OPERATOR_SELECTOR)
    if not deployments:
        return failed("operator", "no frscope operator Deployment in the cluster", HELM_INSTALL)
    for dep in deployments:
        meta = dep["metadata"]
        conditions = {c.get("type"): c for c in (dep.get("status") or {}).get("conditions") or []}
        if (conditions.get("Available") or {}).get("status") == "True":
            return passed("operator", f"Deployment {meta['namespace']}/{meta['name']} is available")
    meta = deployments[0]["metadata"]
    return failed("operator", f"Deployment {meta['namespace']}/{meta['name']} is not available",
                  f"kubectl -n {meta['namespace']} describe deployment {meta['name']}; check its pod's events and logs")


async def _webhook_services(client: KubeClient) -> list[tuple[str, str]] | CheckResult:
    configs = await client.list(WEBHOOKS, None, label_selector=CHART_SELECTOR)
    services = {(h["clientConfig"]["service"]["namespace"], h["clientConfig"]["service"]["name"])
                for c in configs for h in c.get("webhooks") or [] if (h.get("clientConfig") or {}).get("service")}
    if not services:
        return failed("webhook", "no frscope MutatingWebhookConfiguration: pods are not injected",
                      "helm upgrade with webhook.enabled=true, or add the sidecar by hand (docs/install.md)")
    return sorted(services)


async def webhook_service(client: KubeClient) -> CheckResult:
    found = await _webhook_services(client)
    if isinstance(found, CheckResult):
        return found
    for namespace, name in found:
        try:
            await client.get(SERVICES, namespace, name)
        except NotFound:
            return failed("webhook", f"the webhook's Service {namespace}/{name} does not exist: pods start "
                          "without the sidecar (the webhook fails open)", f"helm upgrade the release in {namespace}")
        slices = await client.list(ENDPOINTSLICES, namespace, label_selector=f"kubernetes.io/service-name={name}")
        ready = [e for s in slices for e in s.get("endpoints") or []
                 if (e.get("conditions") or {}).get("ready") is not False and e.get("addresses")]
        if not ready:
            return failed("webhook", f"the webhook's Service {namespace}/{name} has no ready endpoint: pods "
                          "start without the sidecar", f"kubectl -n {namespace} get pods,endpointslices")
    return passed("webhook", "configured; Service " + ", ".join(f"{n}/{s}" for n, s in found) + " has ready endpoints")


async def webhook_ca_bundle(client: KubeClient) -> CheckResult:
    configs = await client.list(WEBHOOKS, None, label_selector=CHART_SELECTOR)
    hooks = [h for c in configs for h in c.get("webhooks") or [] if (h.get("clientConfig") or {}).get("service")]
    if not hooks:
        return failed("webhook-ca", "no frscope webhook to check", "see the webhook check")
    for hook in hooks:
        service = hook["clientConfig"]["service"]
        namespace, name = service["namespace"], service["name"]
        secret_name = f"{name}-webhook-tls"
        try:
            secret = await client.get(SECRETS, namespace, secret_name)
            ca_bundle = base64.b64decode(hook["clientConfig"].get("caBundle") or "")
            serving = base64.b64decode((secret.get("data") or {}).get("tls.crt", ""))
        except NotFound:
            return failed("webhook-ca", f"no serving certificate Secret {namespace}/{secret_name}",
                          f"helm upgrade the release in {namespace} (it makes the certificate)")
        except binascii.Error as e:
            return failed("webhook-ca", f"webhook {hook['name']}: unreadable base64 ({e})", "helm upgrade the release")
        problems = certs.serving_cert_problems(ca_bundle, serving, f"{name}.{namespace}.svc")
        if problems:
            return failed("webhook-ca", f"webhook {hook['name']}: " + "; ".join(problems),
                          "helm upgrade the release (or let cert-manager's CA injector fill caBundle), then "
                          "restart the operator")
    return passed("webhook-ca", "the caBundle signed the operator's serving certificate, valid and named "
                  "for the Service")


# frscope's own CRDs (charts/frscope/crds/) and what each holds.
OWN_CRDS = ((f"{names.REPORT_PLURAL}.{names.REPORT_GROUP}", names.REPORT_VERSION, "reports"),
            (f"{names.NODE_LEDGER_PLURAL}.{names.REPORT_GROUP}", names.REPORT_VERSION, "the node ledger"))


async def own_crds(client: KubeClient) -> CheckResult:
    fix = ("helm show crds <chart> | kubectl apply --server-side --force-conflicts -f - (Helm installs CRDs "
           "once and never upgrades them)")
    stale = []
    for name, version, holds in OWN_CRDS:
        try:
            crd = await client.get(CRDS, None, name)
        except NotFound:
            return failed("crd", f"CRD {name} is not installed: the operator cannot write {holds}", fix)
        served = {v.get("name") for v in (crd.get("spec") or {}).get("versions") or [] if v.get("served")}
        established = any(c.get("type") == "Established" and c.get("status") == "True"
                          for c in (crd.get("status") or {}).get("conditions") or [])
        if version not in served or not established:
            return failed("crd", f"CRD {name} serves {sorted(v for v in served if v)} (established: "
                          f"{established}), this frscope needs {version}", fix)
        why = stale_schema(crd)
        if why:
            stale.append(why)
    if stale:
        return failed("crd", "; ".join(stale), fix)
    return passed("crd", "CRDs " + ", ".join(name for name, _, _ in OWN_CRDS) + " serve what this frscope writes")


async def network_policies(client: KubeClient) -> CheckResult:
    policies = await client.list(NETWORKPOLICIES, None, label_selector=CHART_SELECTOR)
    closed = [p["metadata"] for p in policies if shuts_out_prometheus(p)]
    if closed:
        listed = ", ".join(f"{m['namespace']}/{m['name']}" for m in closed)
        return failed("network-policy", f"NetworkPolicy {listed} admits only frscope's own pods: Prometheus "
                      "cannot scrape", "set networkPolicy.prometheus.namespaceSelector (and podSelector) to "
                      "your Prometheus' namespace/pods and helm upgrade")
    if not policies:
        return passed("network-policy", "no frscope NetworkPolicy: nothing restricts scraping")
    return passed("network-policy", f"{len(policies)} frscope NetworkPolicies admit Prometheus")
