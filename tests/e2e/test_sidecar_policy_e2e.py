"""The sidecars' NetworkPolicy written by the real operator on the real API server (testenv), as the chart
sets it up when no training namespace is named: an opted-in pod appears in a namespace, and the policy the
chart rendered appears there, owned by the chart's ClusterRole, written with only that role's rights;
uninstalling (the ClusterRole deleted) lets the garbage collector remove it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.chart_tools import Helm, objects, one
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


@pytest.fixture
def rendered(kube: ControlPlane, tmp_path: Path) -> list[dict[str, Any]]:
    return objects(Helm(kube.bin_dir / "helm", tmp_path / "helm-home"))


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


@pytest.mark.timeout(180)
def test_an_opted_in_pod_gets_its_namespace_the_sidecar_policy(
        kube: ControlPlane, namespace: str, operator_kubeconfig: Path, rendered: list[dict[str, Any]],
        policy_role: str, tmp_path: Path) -> None:
    operator = OperatorProcess(kube, operator_kubeconfig, tmp_path / "operator.log", ["--poll-interval", "30"],
                               env={"FRSCOPE_SIDECAR_NETWORK_POLICY": _policy_env(rendered)})
    try:
        operator.wait_ready()
        kube.kubectl("create", "serviceaccount", "trainer", "-n", namespace)
        training_pod(kube, namespace, "train-worker-0", "trainer")

        def stored() -> dict[str, Any] | None:
            proc = kube.kubectl("get", "networkpolicy", "frs-frscope-sidecar", "-n", namespace, "-o", "json",
                                check=False)
            return json.loads(proc.stdout) if proc.returncode == 0 else None

        policy = wait_for("the sidecars' NetworkPolicy", stored, 60, diagnostics=operator.logs)
        handed = json.loads(_policy_env(rendered))["policy"]
        assert policy["spec"]["ingress"] == handed["spec"]["ingress"]  # endPort ranges accepted as rendered
        assert policy["spec"]["podSelector"] == {"matchLabels": {"frscope.io/inject": "true"}}
        [owner] = policy["metadata"]["ownerReferences"]
        role_uid = kube.kubectl_json("get", "clusterrole", policy_role)["metadata"]["uid"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("ClusterRole", policy_role, role_uid)
        assert f"NetworkPolicy {namespace}/frs-frscope-sidecar created" in operator.logs()
    finally:
        operator.stop()
    # Uninstalled: the role goes, and with it every policy it owns.
    kube.kubectl("delete", "clusterrolebinding,clusterrole", policy_role)
    wait_for("the policy garbage-collected", lambda: stored() is None, 90)
