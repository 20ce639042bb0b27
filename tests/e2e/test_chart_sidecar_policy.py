"""charts/frscope's NetworkPolicy for the sidecars when no training namespace is named, rendered by the real
helm: by default nobody writes one (namespaces are left as they are); asked to
(`networkPolicy.sidecars.addToNamespacesWithPolicies`), the operator is handed the very policy the chart writes
into named namespaces, Prometheus' peers included, with a ClusterRole that lets it see a namespace's policies
and write only that one. On the real API server: tests/e2e/test_sidecar_policy_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.chart_tools import Helm, objects, of_kind, one
except ModuleNotFoundError:
    from chart_tools import Helm, objects, of_kind, one

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PROMETHEUS = ["networkPolicy.prometheus.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=prom",
              "networkPolicy.prometheus.podSelector.matchLabels.app\\.kubernetes\\.io/name=prometheus"]
ASKED = "networkPolicy.sidecars.addToNamespacesWithPolicies=true"


@pytest.fixture(scope="module")
def helm(testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(testenv_bin_dir / "helm", tmp_path_factory.mktemp("helm-home"))


def _env(objs: list[dict[str, Any]]) -> dict[str, str]:
    container = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_by_default_no_sidecar_policy_is_written_anywhere(helm: Helm) -> None:
    objs = objects(helm)
    assert "FRSCOPE_SIDECAR_NETWORK_POLICY" not in _env(objs)
    assert [p["metadata"]["name"] for p in of_kind(objs, "NetworkPolicy")] == ["frs-frscope-operator"]
    assert not [r for r in of_kind(objs, "ClusterRole") if r["metadata"]["name"].endswith("-sidecar-policy")]


def test_asked_the_operator_writes_the_charts_policy(helm: Helm) -> None:
    objs = objects(helm, sets=[*PROMETHEUS, ASKED])
    handed = json.loads(_env(objs)["FRSCOPE_SIDECAR_NETWORK_POLICY"])
    # The same policy the chart renders into a named namespace.
    named = objects(helm, sets=[*PROMETHEUS, ASKED, "networkPolicy.namespaces={team-a}"])
    written = one(named, "NetworkPolicy", "frs-frscope-sidecar")
    assert handed["policy"]["spec"] == written["spec"]
    assert handed["policy"]["metadata"]["name"] == written["metadata"]["name"]
    assert handed["policy"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "frscope-operator"
    [sidecar_rule] = handed["policy"]["spec"]["ingress"]  # one rule, with peers: nothing else is opened
    assert sidecar_rule["ports"] == [{"protocol": "TCP", "port": 9402}]
    assert [p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") for p in
            sidecar_rule["from"]] == ["frscope", "prometheus"]  # the operator, and Prometheus keeps scraping
    # The operator may see whether a namespace has policies, write that policy and read its owner, nothing else.
    role = one(objs, "ClusterRole", handed["owner"]["name"])
    assert role["rules"] == [
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "create"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
         "resourceNames": ["frs-frscope-sidecar"], "verbs": ["get", "patch"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
         "resourceNames": [handed["owner"]["name"]], "verbs": ["get"]},
    ]
    binding = one(objs, "ClusterRoleBinding", handed["owner"]["name"])
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "frs-frscope", "namespace": "frscope-system"}]
    # With namespaces named the chart writes them itself; with policies off nobody does.
    for sets in (["networkPolicy.namespaces={team-a}"], ["networkPolicy.enabled=false"]):
        other = objects(helm, sets=[*sets, ASKED])
        assert "FRSCOPE_SIDECAR_NETWORK_POLICY" not in _env(other), sets
        assert not [r for r in of_kind(other, "ClusterRole") if r["metadata"]["name"].endswith("-sidecar-policy")]
