"""The sidecars' NetworkPolicy on the real API server (testenv), both ways it gets there:

- written by the real operator when the chart asks it to (`networkPolicy.sidecars.addToNamespacesWithPolicies`,
  no training namespace named): an opted-in pod appears in a namespace that denies by default, and the policy
  the chart rendered appears there, owned by the chart's ClusterRole, written with only that role's rights; a
  namespace without policies of its own is left open (the policy would isolate its training pods);
  uninstalling (the ClusterRole deleted) lets the garbage collector remove it;
- installed by the real helm into a named training namespace that denies by default.

Either way the namespace stays closed except the sidecar port, and that only from the operator and Prometheus:
what the stored policies allow is read by tests/e2e/netpol.py (no CNI that enforces policies runs here)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.chart_tools import CHART, Helm, objects, one
from tests.e2e.netpol import Pod, allowed
from tests.e2e.test_auth_e2e import training_pod
from tests.e2e.test_operator_e2e import (  # noqa: F401  (fixtures used by name)
    OperatorProcess,
    chart_rbac,
    namespace,
    operator_kubeconfig,
    wait_for,
)

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e]

ASKED = "networkPolicy.sidecars.addToNamespacesWithPolicies=true"
OPERATOR_LABELS = {"app.kubernetes.io/name": "frscope", "app.kubernetes.io/instance": "frs",
                   "app.kubernetes.io/component": "operator"}
DEFAULT_DENY = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "default-deny"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
# Ports of a training pod: the sidecar's, torch's rendezvous (MASTER_PORT), an NCCL/Gloo data port, the edges.
PORTS = [("TCP", 9402), ("TCP", 29500), ("TCP", 43117), ("TCP", 1), ("TCP", 65535), ("UDP", 9402), ("SCTP", 9402)]


@pytest.fixture
def rendered(kube: ControlPlane, tmp_path: Path) -> list[dict[str, Any]]:
    return objects(Helm(kube.bin_dir / "helm", tmp_path / "helm-home"), sets=[ASKED])


@pytest.fixture
def policy_role(kube: ControlPlane, namespace: str, rendered: list[dict[str, Any]]) -> Iterator[str]:
    """The chart's ClusterRole for the sidecars' policy, bound to the test's operator account."""
    handed = json.loads(_policy_env(rendered))
    role = one(rendered, "ClusterRole", handed["owner"]["name"])
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": role["metadata"]["name"]}, "rules": role["rules"]})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": role["metadata"]["name"]},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role["metadata"]["name"]},
                "subjects": [{"kind": "ServiceAccount", "name": "frscope-operator", "namespace": namespace}]})
    yield role["metadata"]["name"]
    kube.kubectl("delete", "clusterrolebinding,clusterrole", role["metadata"]["name"], "--ignore-not-found")


def _policy_env(rendered: list[dict[str, Any]]) -> str:
    container = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    [value] = [e["value"] for e in container["env"] if e["name"] == "FRSCOPE_SIDECAR_NETWORK_POLICY"]
    return str(value)


def _training_namespace(kube: ControlPlane, prefix: str, *, deny: bool) -> str:
    name = f"{prefix}-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", name)
    wait_for("the default ServiceAccount", lambda: kube.kubectl(
        "get", "serviceaccount", "default", "-n", name, check=False).returncode == 0, 30)
    kube.kubectl("create", "serviceaccount", "trainer", "-n", name)
    if deny:
        kube.apply({**DEFAULT_DENY, "metadata": {"name": "default-deny", "namespace": name}})
    return name


def _stored_policies(kube: ControlPlane, ns: str) -> list[dict[str, Any]]:
    return list(kube.kubectl_json("get", "networkpolicy", "-n", ns)["items"])


def assert_closed_but_the_sidecar_port(policies: list[dict[str, Any]], ns: str, release_ns: str) -> None:
    """Under these policies of `ns`, an opted-in training pod accepts the sidecar port (TCP 9402) from the
    operator and Prometheus, and nothing from anyone else on any port; a pod that is not opted in, nothing."""
    trainer = Pod(ns, {"frscope.io/inject": "true", "training.kubeflow.org/job-name": "train"})
    operator = Pod(release_ns, OPERATOR_LABELS)
    prometheus = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
    others = {
        "another rank of the job": Pod(ns, trainer.labels),
        "a pod of the namespace": Pod(ns, {"app": "notebook"}),
        "a tenant's pod": Pod("tenant-b", {"app": "x"}),
        "a tenant's pod posing as Prometheus": Pod("tenant-b", {"app.kubernetes.io/name": "prometheus"}),
        "another pod of the monitoring namespace": Pod("monitoring", {"app.kubernetes.io/name": "grafana"}),
        "another pod of the release namespace": Pod(release_ns, {**OPERATOR_LABELS, "app.kubernetes.io/component":
                                                                 "test"}),
        "an operator of another namespace": Pod("elsewhere", OPERATOR_LABELS),
    }
    for protocol, port in PORTS:
        sidecar_port = (protocol, port) == ("TCP", 9402)
        for who, source in (("the operator", operator), ("Prometheus", prometheus)):
            assert allowed(policies, trainer, source, port, protocol) is sidecar_port, (who, protocol, port)
        for who, source in others.items():
            assert not allowed(policies, trainer, source, port, protocol), (who, protocol, port)
        plain = Pod(ns, {"app": "notebook"})
        assert not allowed(policies, plain, operator, port, protocol), ("not opted in", protocol, port)


def test_the_reading_of_the_policies_can_fail() -> None:
    """The earlier chart's policy (a second rule without `from` for every other port) next to a default-deny:
    the check above refuses it (every port of the training pods open to the whole cluster)."""
    old_spec = {"podSelector": {"matchLabels": {"frscope.io/inject": "true"}}, "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rel"}},
                                       "podSelector": {"matchLabels": OPERATOR_LABELS}},
                                      {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name":
                                                                             "monitoring"}},
                                       "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
                             "ports": [{"protocol": "TCP", "port": 9402}]},
                            {"ports": [{"protocol": "TCP", "port": 1, "endPort": 9401},
                                       {"protocol": "TCP", "port": 9403, "endPort": 65535}]}]}
    policies = [{"metadata": {"name": "default-deny", "namespace": "ml"}, "spec": DEFAULT_DENY["spec"]},
                {"metadata": {"name": "frs-frscope-sidecar", "namespace": "ml"}, "spec": old_spec}]
    with pytest.raises(AssertionError, match="29500"):  # the rendezvous port, open to the operator and all
        assert_closed_but_the_sidecar_port(policies, "ml", "rel")
    fixed = [policies[0], {**policies[1], "spec": {**old_spec, "ingress": old_spec["ingress"][:1]}}]
    assert_closed_but_the_sidecar_port(fixed, "ml", "rel")
    # And an open namespace (no policy) is open to all, as Kubernetes has it.
    assert allowed([], Pod("ml", {}), Pod("tenant-b", {}), 29500)


@pytest.mark.timeout(240)
def test_asked_the_operator_adds_the_policy_where_the_namespace_has_its_own(
        kube: ControlPlane, namespace: str, operator_kubeconfig: Path, rendered: list[dict[str, Any]],
        policy_role: str, tmp_path: Path) -> None:
    denying = _training_namespace(kube, "deny", deny=True)
    open_ns = _training_namespace(kube, "open", deny=False)
    operator = OperatorProcess(kube, operator_kubeconfig, tmp_path / "operator.log", ["--poll-interval", "30"],
                               env={"FRSCOPE_SIDECAR_NETWORK_POLICY": _policy_env(rendered)})
    try:
        operator.wait_ready()
        training_pod(kube, open_ns, "train-worker-0", "trainer")
        training_pod(kube, denying, "train-worker-0", "trainer")

        def stored(ns: str) -> dict[str, Any] | None:
            proc = kube.kubectl("get", "networkpolicy", "frs-frscope-sidecar", "-n", ns, "-o", "json", check=False)
            return json.loads(proc.stdout) if proc.returncode == 0 else None

        policy = wait_for("the sidecars' NetworkPolicy", lambda: stored(denying), 60, diagnostics=operator.logs)
        handed = json.loads(_policy_env(rendered))["policy"]
        assert policy["spec"]["ingress"] == handed["spec"]["ingress"]
        assert policy["spec"]["podSelector"] == {"matchLabels": {"frscope.io/inject": "true"}}
        [owner] = policy["metadata"]["ownerReferences"]
        role_uid = kube.kubectl_json("get", "clusterrole", policy_role)["metadata"]["uid"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("ClusterRole", policy_role, role_uid)
        assert f"NetworkPolicy {denying}/frs-frscope-sidecar created" in operator.logs()
        # The namespace that denies by default stays closed but for the sidecar port, from the operator and
        # Prometheus (the chart's default selectors).
        assert_closed_but_the_sidecar_port(_stored_policies(kube, denying), denying, "frscope-system")
        # The namespace without policies of its own is left open: no policy isolates its training pods.
        wait_for("the open namespace looked at", lambda: f"namespace {open_ns} has no NetworkPolicy of its own"
                 in operator.logs(), 60, diagnostics=operator.logs)
        assert stored(open_ns) is None and _stored_policies(kube, open_ns) == []
    finally:
        operator.stop()
        # Uninstalled: the role goes, and with it every policy it owns.
        kube.kubectl("delete", "clusterrolebinding,clusterrole", policy_role)
        try:
            wait_for("the policy garbage-collected", lambda: stored(denying) is None, 90)
            assert [p["metadata"]["name"] for p in _stored_policies(kube, denying)] == ["default-deny"]
        finally:
            for ns in (denying, open_ns):
                kube.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


@pytest.mark.timeout(300)
def test_helm_installed_policy_keeps_a_default_deny_namespace_closed(kube: ControlPlane, tmp_path: Path) -> None:
    """`helm install` naming a training namespace that denies by default: the chart's policies stored by the
    API server open the sidecar port of opted-in pods to the operator and Prometheus, and nothing else."""
    helm = Helm(kube.bin_dir / "helm", tmp_path / "helm-home", kube.kubeconfig)
    denying = _training_namespace(kube, "deny", deny=True)
    release_ns = f"frscope-{secrets.token_hex(3)}"
    try:
        helm.run("install", "frs", str(CHART), "--namespace", release_ns, "--create-namespace",
                 "--set", f"networkPolicy.namespaces={{{denying}}}", timeout=180)
        policies = _stored_policies(kube, denying)
        assert sorted(p["metadata"]["name"] for p in policies) == ["default-deny", "frs-frscope-sidecar"]
        assert_closed_but_the_sidecar_port(policies, denying, release_ns)
        # The operator's own pod: its HTTP port from opted-in pods of that namespace and Prometheus only.
        [own] = _stored_policies(kube, release_ns)
        operator = Pod(release_ns, OPERATOR_LABELS)
        trainer = Pod(denying, {"frscope.io/inject": "true"})
        assert allowed([own], operator, trainer, 8080)
        assert allowed([own], operator, Pod("monitoring", {"app.kubernetes.io/name": "prometheus"}), 8080)
        assert not allowed([own], operator, Pod("tenant-b", {"frscope.io/inject": "true"}), 8080)
        assert not allowed([own], operator, Pod(denying, {"app": "notebook"}), 8080)
    finally:
        helm.run("uninstall", "frs", "--namespace", release_ns, "--wait", "--timeout", "60s", check=False)
        for ns in (denying, release_ns):
            kube.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
