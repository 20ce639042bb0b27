"""charts/frscope rendered by the real helm (built by testenv): lint, templates over several values files,
the values schema, and what the rendered objects promise (labels, pod security, RBAC shape, webhook,
certificates, monitoring objects, dashboard). Installing into a real API server: test_chart_install.py."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e import kube_matrix
    from tests.e2e.chart_tools import CHART, MONITORING_KINDS, VALUES_SETS, Helm, objects, of_kind, one, rules_file
except ModuleNotFoundError:
    import kube_matrix
    from chart_tools import CHART, MONITORING_KINDS, VALUES_SETS, Helm, objects, of_kind, one, rules_file

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

RUNBOOKS = CHART.parents[1] / "docs" / "runbooks.md"
RENDERED = ["defaults", "all-on", "monitoring-off", "namespaced", "install"]
OPERATOR_ROLE = "frs-frscope-operator"
LEDGER_ROLE = "frs-frscope-operator-ledger"  # the node ledger's (templates/rbac-ledger.yaml), on by default
STANDARD = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by", "helm.sh/chart")


@pytest.fixture(scope="module")
def helm(testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(testenv_bin_dir / "helm", tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> dict[str, list[dict[str, Any]]]:
    return {name: objects(helm, name) for name in RENDERED}


def _kinds(objs: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objs}


def _deployment_pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objs, "Deployment")["spec"]["template"]


@pytest.mark.parametrize("values", list(VALUES_SETS))
def test_lint_strict(helm: Helm, values: str) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", "frscope-system"]
    for f in VALUES_SETS[values]:
        args += ["-f", str(f)]
    out = helm.run(*args).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


@pytest.mark.parametrize("values", RENDERED)
def test_every_object_has_standard_labels_and_pod_templates_no_chart_label(
    rendered: dict[str, list[dict[str, Any]]], values: str
) -> None:
    objs = rendered[values]
    assert objs
    for obj in objs:
        labels = obj["metadata"].get("labels", {})
        missing = [k for k in STANDARD if k not in labels]
        assert not missing, f"{obj['kind']}/{obj['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == "frs"
    pod_labels = _deployment_pod(objs)["metadata"]["labels"]
    assert "helm.sh/chart" not in pod_labels
    selector = one(objs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert "app.kubernetes.io/version" not in selector  # selectors are immutable across upgrades


def test_defaults_render_the_operator_webhook_and_dashboard_but_no_monitoring(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objs = rendered["defaults"]
    assert _kinds(objs) == {
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "Secret",
        "MutatingWebhookConfiguration", "ConfigMap", "NetworkPolicy",
        "Role", "RoleBinding",  # minting the operator's own per-pod tokens for the sidecars
        "Pod",  # `helm test`'s (a hook: created by `helm test` only)
    }
    for obj in objs:
        if obj["metadata"]["name"] == "frs-frscope-operator-ledger-events":  # reads the kubelet's node Events
            assert obj["metadata"]["namespace"] == "default", obj["metadata"]
        elif obj["kind"] not in {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"}:
            assert obj["metadata"]["namespace"] == "frscope-system", obj["metadata"]
    deploy = one(objs, "Deployment")
    assert deploy["metadata"]["name"] == "frs-frscope"
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = _deployment_pod(objs)["spec"]["containers"]
    assert container["image"] == "ghcr.io/frscope/frscope:0.1.0"
    assert container["args"][0] == "operator"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "http", probe
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    service = one(objs, "Service")
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {"http": "http", "https": "https",
                                                                             "webhook": "webhook"}
    assert service["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("values", RENDERED)
def test_operator_pod_security_is_restricted(rendered: dict[str, list[dict[str, Any]]], values: str) -> None:
    spec = _deployment_pod(rendered[values])["spec"]
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert isinstance(pod["runAsUser"], int) and pod["runAsUser"] > 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is True  # it talks to the API server
    assert "hostNetwork" not in spec and "hostPID" not in spec
    for container in spec["containers"] + spec.get("initContainers", []):
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0
        assert sc.get("privileged", False) is False
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for volume in spec["volumes"]:
        assert set(volume) & {"emptyDir", "secret", "projected"}, volume  # no hostPath
        for source in volume.get("projected", {}).get("sources", []):
            assert source["serviceAccountToken"]["audience"] == "frscope.io/sidecar"  # never the API's


@pytest.mark.parametrize("values", RENDERED)
def test_the_helm_test_pod_is_a_restricted_hook_that_sees_only_the_webhook_ca(
    rendered: dict[str, list[dict[str, Any]]], values: str
) -> None:
    [pod] = of_kind(rendered[values], "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "test"  # what the NetworkPolicy admits
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = spec["containers"]
    assert container["image"] == _deployment_pod(rendered[values])["spec"]["containers"][0]["image"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
    env = {e["name"]: e["value"] for e in container["env"]}
    ports = {p["name"]: p["port"] for p in one(rendered[values], "Service")["spec"]["ports"]}
    assert env["OPERATOR_SERVICE"] == "frs-frscope.frscope-system.svc" and env["HTTP_PORT"] == str(ports["http"])
    assert env.get("WEBHOOK_PORT") == (str(ports["webhook"]) if "webhook" in ports else None)
    for volume in spec.get("volumes", []):  # the webhook's Secret: its CA only, never the key
        assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}], volume
    assert bool(spec.get("volumes")) == ("WEBHOOK_PORT" in env)


def test_webhook_is_opt_in_fails_open_and_skips_system_namespaces(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    hook, by_namespace, jobset_by_namespace = one(rendered["defaults"], "MutatingWebhookConfiguration")["webhooks"]
    # Opt-in by namespace: the job pods of namespaces with the label, unless the pod says =false; one
    # entry per family of job pods (PyTorchJob; TrainJob and JobSet), a selector cannot OR two labels.
    for entry, job_label in ((by_namespace, "training.kubeflow.org/job-name"),
                             (jobset_by_namespace, "jobset.sigs.k8s.io/jobset-name")):
        assert entry["clientConfig"]["service"]["path"] == "/inject-namespace"
        assert entry["namespaceSelector"]["matchLabels"] == {"frscope.io/inject": "true"}
        assert entry["objectSelector"]["matchExpressions"] == [
            {"key": job_label, "operator": "Exists"},
            {"key": "frscope.io/inject", "operator": "NotIn", "values": ["true", "false"]}]
        assert entry["failurePolicy"] == "Ignore"
        assert entry["namespaceSelector"]["matchExpressions"] == hook["namespaceSelector"]["matchExpressions"]
    assert [by_namespace["name"], jobset_by_namespace["name"]] == ["inject-namespace.frscope.io",
                                                                   "inject-namespace-jobset.frscope.io"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["objectSelector"] == {"matchLabels": {"frscope.io/inject": "true"}}
    (excluded,) = hook["namespaceSelector"]["matchExpressions"]
    assert excluded["key"] == "kubernetes.io/metadata.name" and excluded["operator"] == "NotIn"
    assert {"kube-system", "kube-public", "kube-node-lease"} <= set(excluded["values"])
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    service = hook["clientConfig"]["service"]
    assert (service["name"], service["namespace"], service["port"]) == ("frs-frscope", "frscope-system", 443)
    # Watching a list of namespaces: the webhook is limited to them too.
    for namespaced in one(rendered["namespaced"], "MutatingWebhookConfiguration")["webhooks"]:
        exprs = {e["operator"]: e["values"] for e in namespaced["namespaceSelector"]["matchExpressions"]}
        assert exprs["In"] == ["team-a", "team-b"]
    assert "MutatingWebhookConfiguration" not in _kinds(rendered["monitoring-off"])


def _pem(data: str) -> str:
    return base64.b64decode(data).decode()


def test_chart_generated_certificate_is_signed_by_the_ca_bundle_for_the_service(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    objs = rendered["defaults"]
    secret = one(objs, "Secret", "frs-frscope-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    hooks = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    assert all(hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"] for hook in hooks)
    (tmp_path / "ca.pem").write_text(_pem(secret["data"]["ca.crt"]))
    (tmp_path / "tls.pem").write_text(_pem(secret["data"]["tls.crt"]))
    (tmp_path / "tls.key").write_text(_pem(secret["data"]["tls.key"]))

    def openssl(*args: str) -> str:
        proc = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=tmp_path, timeout=30,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "tls.pem: OK" in openssl("verify", "-purpose", "sslserver", "-CAfile", "ca.pem", "tls.pem")
    sans = openssl("x509", "-in", "tls.pem", "-noout", "-ext", "subjectAltName")
    assert "DNS:frs-frscope.frscope-system.svc" in sans, sans
    # The key belongs to the certificate.
    assert openssl("x509", "-in", "tls.pem", "-noout", "-pubkey") == openssl("pkey", "-in", "tls.key", "-pubout")
    # The operator mounts exactly this Secret.
    volumes = {v["name"]: v for v in _deployment_pod(objs)["spec"]["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == secret["metadata"]["name"]


def test_cert_manager_replaces_the_generated_certificate(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["all-on"]
    # No generated key pair (only the metrics reader's token Secret, which the token controller fills).
    assert [o["type"] for o in of_kind(objs, "Secret")] == ["kubernetes.io/service-account-token"]
    cert = one(objs, "Certificate", "frs-frscope-webhook")
    assert cert["spec"]["secretName"] == "frs-frscope-webhook-tls"
    assert "frs-frscope.frscope-system.svc" in cert["spec"]["dnsNames"]
    assert one(objs, "Issuer")["spec"] == {"selfSigned": {}}
    mwc = one(objs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "frscope-system/frs-frscope-webhook"
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]


def _rules(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj["rules"])


def test_rbac_is_least_privilege(rendered: dict[str, list[dict[str, Any]]]) -> None:
    role = one(rendered["defaults"], "ClusterRole", OPERATOR_ROLE)
    granted = {(g, r, v) for rule in _rules(role) for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert not [rule for rule in _rules(role) if "*" in rule["verbs"] + rule["resources"] + rule["apiGroups"]]
    resources = {r for _, r, _ in granted}
    kinds = {"pytorchjobs", "trainjobs", "jobsets"}  # operator.jobKinds: all on by default
    assert resources == {"customresourcedefinitions", *kinds, *{f"{k}/status" for k in kinds}, "pods", "events",
                         "flightrecorderreports", "tokenreviews", "subjectaccessreviews"}
    writes = {(g, r, v) for g, r, v in granted if v not in {"get", "list", "watch"}}
    assert writes == {
        # The job itself is only read; its condition goes through the status subresource.
        ("kubeflow.org", "pytorchjobs/status", "patch"),
        ("trainer.kubeflow.org", "trainjobs/status", "patch"),
        ("jobset.x-k8s.io", "jobsets/status", "patch"),
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
        ("", "events", "create"), ("", "events", "patch"),
        ("events.k8s.io", "events", "create"), ("events.k8s.io", "events", "patch"),
        *{("frscope.io", "flightrecorderreports", v) for v in ("create", "update", "patch", "delete")},
    }
    binding = one(rendered["defaults"], "ClusterRoleBinding", OPERATOR_ROLE)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "frs-frscope", "namespace": "frscope-system"}]


def test_rbac_rules_are_each_commented() -> None:
    text = (CHART / "templates" / "rbac.yaml").read_text() + (CHART / "templates" / "_helpers.tpl").read_text()
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if line.strip().startswith("- apiGroups:"):
            above = lines[n - 1].strip()
            assert above.startswith("#"), f"rule without a comment: {line.strip()} (after {above!r})"


def test_namespaced_install_grants_namespaced_rights_per_namespace(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objs = rendered["namespaced"]
    cluster = one(objs, "ClusterRole", OPERATOR_ROLE)
    assert {r for rule in _rules(cluster) for r in rule["resources"]} == {
        "customresourcedefinitions", "namespaces", "tokenreviews", "subjectaccessreviews"}
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in _rules(cluster)
               if not rule["resources"][0].endswith("reviews"))
    tokens = [r for r in of_kind(objs, "Role") if r["metadata"]["name"].endswith("-operator-tokens")]
    assert [(t["metadata"]["namespace"], _rules(t)[0]["resources"], _rules(t)[0]["resourceNames"])
            for t in tokens] == [("frscope-system", ["serviceaccounts/token"], ["frs-frscope"])]
    roles = [r for r in of_kind(objs, "Role") if r["metadata"]["name"] == OPERATOR_ROLE]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert "pytorchjobs" in {r for rule in _rules(role) for r in rule["resources"]}
    bindings = [b for b in of_kind(objs, "RoleBinding") if b["metadata"]["name"] == OPERATOR_ROLE]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    args = _deployment_pod(objs)["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args


def test_several_replicas_elect_a_leader_through_a_lease_and_the_service_routes_to_it(
    rendered: dict[str, list[dict[str, Any]]], helm: Helm,
) -> None:
    objs = rendered["all-on"]  # 2 replicas, the Lease's timing set
    deploy = one(objs, "Deployment")
    assert deploy["spec"]["replicas"] == 2 and "strategy" not in deploy["spec"]  # a rolling update
    pod = _deployment_pod(objs)
    assert pod["metadata"]["labels"]["frscope.io/operator-role"] == "standby"  # until it holds the Lease
    args = pod["spec"]["containers"][0]["args"]
    assert {"--leader-election-lease=frs-frscope", "--lease-duration=20", "--lease-renew-deadline=12",
            "--lease-retry-period=3"} <= set(args), args
    env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env  # its identity, its pod to label, the Lease's namespace
    service = one(objs, "Service")
    assert service["spec"]["selector"] == {**deploy["spec"]["selector"]["matchLabels"],
                                           "frscope.io/operator-role": "leader"}
    # The budget counts every replica (all Ready): the leader can be evicted, a standby takes over.
    assert "frscope.io/operator-role" not in one(objs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    role = one(objs, "Role", "frs-frscope-leader-election")
    assert role["metadata"]["namespace"] == "frscope-system"
    assert _rules(role) == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["frs-frscope"],
         "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
    ]
    binding = one(objs, "RoleBinding", "frs-frscope-leader-election")
    assert binding["roleRef"]["name"] == "frs-frscope-leader-election"
    assert not [r for r in _rules(one(objs, "ClusterRole", OPERATOR_ROLE)) if r["apiGroups"] == ["kopf.dev"]]
    # One replica: no election, no Lease permission, the Service selects the pod as it is.
    defaults = rendered["defaults"]
    assert not [r for r in of_kind(defaults, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert not [a for a in _deployment_pod(defaults)["spec"]["containers"][0]["args"] if "lease" in a]
    assert "frscope.io/operator-role" not in one(defaults, "Service")["spec"]["selector"]
    # A timing that leaves the leader no time to stop before a standby takes over is refused.
    bad = helm.run("template", "frs", str(CHART), "--set", "operator.replicas=2",
                   "--set", "operator.leaderElection.renewDeadlineSeconds=15", check=False)
    assert bad.returncode != 0 and "leaseDurationSeconds must exceed renewDeadlineSeconds" in bad.stderr


@pytest.mark.parametrize("values", RENDERED)
def test_monitoring_objects_only_when_enabled(rendered: dict[str, list[dict[str, Any]]], values: str) -> None:
    kinds = _kinds(rendered[values])
    expected = {
        "defaults": set(),
        "all-on": MONITORING_KINDS,
        "monitoring-off": set(),
        "namespaced": {"PodMonitor"},
        "install": MONITORING_KINDS,
    }[values]
    assert kinds & MONITORING_KINDS == expected
    assert ("ConfigMap" in kinds) is (values != "monitoring-off")


def test_monitoring_objects_carry_extra_labels_and_scrape_the_right_ports(
    rendered: dict[str, list[dict[str, Any]]], helm: Helm,
) -> None:
    objs = rendered["all-on"]
    for kind in MONITORING_KINDS:
        labels = one(objs, kind)["metadata"]["labels"]
        assert labels["release"] == "kube-prometheus-stack", kind
        assert labels["team"] == "ml-infra", kind  # commonLabels
    pm = one(objs, "PodMonitor")
    assert pm["spec"]["selector"] == {"matchLabels": {"frscope.io/inject": "true"}}
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "frscope" and endpoint["path"] == "/metrics"
    assert {r["targetLabel"] for r in endpoint["relabelings"]} >= {"training_job", "job_kind", "pytorchjob"}
    sm = one(objs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["http"]
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True  # the per-job diagnosis gauge keeps the job's namespace
    # /metrics wants a token allowed `get /metrics` (auth.metrics): `authorization` from a Secret (the deprecated
    # bearerTokenFile is refused by OpenShift's user-workload monitoring), the token of the chart's reader.
    endpoint_sm = sm["spec"]["endpoints"][0]
    assert "bearerTokenFile" not in endpoint_sm
    assert endpoint_sm["authorization"] == {"type": "Bearer",
                                            "credentials": {"name": "frs-frscope-metrics-reader", "key": "token"}}
    secret = one(objs, "Secret", "frs-frscope-metrics-reader")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": "frs-frscope-metrics-reader"}
    reader = one(objs, "ClusterRole", "frs-frscope-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # Series hygiene: `_created` dropped, sampleLimit on the sidecars, extra relabelings appended.
    drop_created = {"sourceLabels": ["__name__"], "regex": ".+_created", "action": "drop"}
    assert endpoint_sm["metricRelabelings"][0] == drop_created
    assert endpoint["metricRelabelings"][0] == drop_created
    assert pm["spec"]["sampleLimit"] == 10000 and "sampleLimit" not in sm["spec"]
    own = objects(helm, sets=["podMonitor.enabled=true", "podMonitor.sampleLimit=0", "serviceMonitor.enabled=true",
                        "serviceMonitor.sampleLimit=5000", "serviceMonitor.tokenSecret.name=prom-token",
                        "podMonitor.metricRelabelings[0].action=labeldrop",
                        "podMonitor.metricRelabelings[0].regex=replica_type"])
    own_pm, own_sm = one(own, "PodMonitor"), one(own, "ServiceMonitor")
    assert "sampleLimit" not in own_pm["spec"] and own_sm["spec"]["sampleLimit"] == 5000
    assert own_pm["spec"]["podMetricsEndpoints"][0]["metricRelabelings"] == [
        drop_created, {"action": "labeldrop", "regex": "replica_type"}]
    assert own_sm["spec"]["endpoints"][0]["authorization"]["credentials"] == {"name": "prom-token", "key": "token"}
    assert not [o for o in own if o["metadata"]["name"].endswith("-metrics-reader")]  # the user's Secret instead
    alerts = {r["alert"]: r for g in one(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {"FrscopeOperatorDown", "FrscopePublishErrors", "FrscopeCollectiveStalled",
                           "FrscopeDiagnosisMade", "FrscopeSidecarDown"}
    for alert in alerts.values():
        assert alert["labels"]["team"] == "ml-infra"
        assert alert["labels"]["severity"]
        # The operator's own alert names the release; the others the job, pod or step from the series.
        assert ("{{ $labels." in alert["annotations"]["summary"]) is (alert["alert"] != "FrscopeOperatorDown")
        # Every alert links to its own section of docs/runbooks.md, and that section exists.
        url = alert["annotations"]["runbook_url"]
        assert url == f"https://github.com/frscope/frscope/blob/main/docs/runbooks.md#{alert['alert'].lower()}"
        assert f"\n## {alert['alert']}\n" in RUNBOOKS.read_text()
    assert 'job="frscope-system/frs-frscope-sidecars"' in alerts["FrscopeSidecarDown"]["expr"]
    assert alerts["FrscopeOperatorDown"]["expr"] == 'absent(up{job="frs-frscope"} == 1)'
    # One diagnosis alert per job, routed by the job's namespace; the promtool tests fire each alert
    # (test_chart_rules.py).
    assert "by (namespace, training_job, category)" in alerts["FrscopeDiagnosisMade"]["expr"]
    # Without the ServiceMonitor nothing scrapes the operator: no FrscopeOperatorDown (it would always fire).
    no_sm = objects(helm, sets=["prometheusRule.enabled=true"])
    assert "FrscopeOperatorDown" not in {r["alert"] for g in one(no_sm, "PrometheusRule")["spec"]["groups"]
                                         for r in g["rules"]}
    namespaced_pm = one(rendered["namespaced"], "PodMonitor")
    assert namespaced_pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_rendered_alert_rules_pass_promtool(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make deps-apt` installs Debian's prometheus package", pytrace=False)
    rules = tmp_path / "frscope-rules.yaml"
    rules.write_text(rules_file(rendered["all-on"]))
    proc = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 5 rules found" in proc.stdout + proc.stderr


def test_dashboard_configmap_loads_the_json_file_with_settable_label(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    source = json.loads((CHART / "files" / "frscope-dashboard.json").read_text())
    cm = one(rendered["defaults"], "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["frscope.json"]) == source
    custom = one(rendered["all-on"], "ConfigMap")
    assert custom["metadata"]["namespace"] == "monitoring"
    assert custom["metadata"]["labels"]["grafana_dashboard"] == "frscope"
    assert custom["metadata"]["annotations"] == {"grafana_folder": "ML"}


def test_network_policy_opens_only_the_sidecar_port_to_the_operator_and_prometheus(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    policies = [p for p in of_kind(rendered["all-on"], "NetworkPolicy") if p["metadata"]["name"].endswith("-sidecar")]
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    policy = policies[0]["spec"]
    assert policy["podSelector"] == {"matchLabels": {"frscope.io/inject": "true"}}
    assert policy["policyTypes"] == ["Ingress"]
    # One rule, with peers: no port but the sidecar's, no peer but the operator and Prometheus. (The old
    # second rule without `from` opened every other port of the training pods to the whole cluster in a
    # namespace that denies by default.)
    [sidecar_rule] = policy["ingress"]
    assert sidecar_rule["ports"] == [{"protocol": "TCP", "port": 9402}]
    peers = sidecar_rule["from"]
    assert len(peers) == 2
    assert peers[0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "frscope-system"}}
    assert peers[0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert peers[1] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    # Watching namespaces does not ask for a policy in them (it would isolate the training pods of a namespace
    # without policies): only networkPolicy.namespaces does; the operator's own policy stays.
    assert [p["metadata"]["name"] for p in of_kind(rendered["namespaced"], "NetworkPolicy")] == ["frs-frscope-operator"]
    assert [p["metadata"]["name"] for p in of_kind(rendered["defaults"], "NetworkPolicy")] == ["frs-frscope-operator"]


@pytest.mark.parametrize("sets", [
    ["serviceMonitor.enabled=true"],
    ["podMonitor.enabled=true", "networkPolicy.namespaces={team-a}"],
    ["podMonitor.enabled=true", "networkPolicy.sidecars.addToNamespacesWithPolicies=true"],
])
def test_monitoring_with_no_prometheus_peer_fails_loudly(helm: Helm, sets: list[str]) -> None:
    """With the Prometheus selectors emptied, the chart's policies would time every scrape out: install fails,
    saying which values to set."""
    empty = ["networkPolicy.prometheus.namespaceSelector=null", "networkPolicy.prometheus.podSelector=null"]
    proc = helm.run("template", "frs", str(CHART), "--namespace", "frscope-system",
                    *[a for s in [*sets, *empty] for a in ("--set", s)], check=False)
    assert proc.returncode != 0
    assert "networkPolicy.prometheus is empty" in proc.stderr and "namespaceSelector" in proc.stderr, proc.stderr
    # The same monitoring with the default selectors, or a sidecar policy nobody asked for: fine.
    helm.run("template", "frs", str(CHART), *[a for s in sets for a in ("--set", s)])
    helm.run("template", "frs", str(CHART), "--set", "podMonitor.enabled=true", *[a for s in empty
                                                                                  for a in ("--set", s)])


def test_user_roles_aggregate_reading_the_reports(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """A namespace viewer can `kubectl get flightrecorderreports`: Kubernetes' view/edit/admin roles aggregate
    these (installed: test_chart_install.py). Nothing about the cluster-scoped node ledger."""
    view = one(rendered["defaults"], "ClusterRole", "frs-frscope-view")
    edit = one(rendered["defaults"], "ClusterRole", "frs-frscope-edit")
    labels = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in view["metadata"]["labels"].items() if k.startswith(labels) and v == "true"} == {
        f"{labels}view", f"{labels}edit", f"{labels}admin"}
    assert {k for k, v in edit["metadata"]["labels"].items() if k.startswith(labels) and v == "true"} == {
        f"{labels}edit", f"{labels}admin"}
    assert view["rules"] == [{"apiGroups": ["frscope.io"], "resources": ["flightrecorderreports"],
                              "verbs": ["get", "list", "watch"]}]
    assert edit["rules"] == [{"apiGroups": ["frscope.io"], "resources": ["flightrecorderreports"],
                              "verbs": ["delete", "deletecollection"]}]


def test_pod_disruption_budget_only_with_more_than_one_replica(
    rendered: dict[str, list[dict[str, Any]]], helm: Helm,
) -> None:
    pdb = one(rendered["all-on"], "PodDisruptionBudget")  # 2 replicas
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == one(rendered["all-on"], "Deployment")["spec"]["selector"]
    assert not of_kind(rendered["defaults"], "PodDisruptionBudget")  # one replica: a budget would block drains
    assert of_kind(objects(helm, sets=["operator.replicas=3"]), "PodDisruptionBudget")
    assert not of_kind(objects(helm, sets=["operator.replicas=3", "operator.podDisruptionBudget.enabled=false"]),
                       "PodDisruptionBudget")


def test_network_policy_of_the_operator_is_on_by_default(rendered: dict[str, list[dict[str, Any]]]) -> None:
    [policy] = of_kind(rendered["defaults"], "NetworkPolicy")  # no training namespaces known: the operator's only
    assert policy["metadata"]["namespace"] == "frscope-system"
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    http_rule, webhook_rule = spec["ingress"]
    assert http_rule["ports"] == [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 8443}]  # + HTTPS
    # Pushes only from opted-in pods (of every namespace, as none is named); the webhook from anywhere.
    opted_in = {"matchLabels": {"frscope.io/inject": "true"}}
    test_pod = {"matchLabels": {"app.kubernetes.io/name": "frscope", "app.kubernetes.io/instance": "frs",
                                "app.kubernetes.io/component": "test"}}
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    assert http_rule["from"] == [{"namespaceSelector": {}, "podSelector": opted_in}, prometheus,
                                 {"podSelector": test_pod}]
    assert webhook_rule == {"ports": [{"protocol": "TCP", "port": 9443}]}
    named = [p for p in of_kind(rendered["all-on"], "NetworkPolicy") if p["metadata"]["name"].endswith("-operator")]
    peers = named[0]["spec"]["ingress"][0]["from"]
    assert [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in peers[:2]] == [
        "team-a", "team-b"]
    assert peers[2]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


def test_auth_defaults_project_the_tokens_and_tell_the_webhook(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pod = _deployment_pod(rendered["defaults"])["spec"]
    container = pod["containers"][0]
    assert "--sidecar-auth=kubernetes" in container["args"] and "--ui-auth=port-forward" in container["args"]
    assert "--metrics-auth=port-forward" in container["args"]
    # The shared-audience token of earlier versions is gone: each sidecar gets a token minted for its pod.
    assert not [a for a in container["args"] if a.startswith("--sidecar-token-file")]
    assert not [v for v in pod["volumes"] if "projected" in v]
    assert not [m for m in container["volumeMounts"] if m["mountPath"].startswith("/var/run/secrets/frscope")]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FRSCOPE_OPERATOR_IDENTITY"] == "system:serviceaccount:frscope-system:frs-frscope"


def test_images_tags_digests_and_sidecar_settings(rendered: dict[str, list[dict[str, Any]]]) -> None:
    container = _deployment_pod(rendered["all-on"])["spec"]["containers"][0]
    assert container["image"] == (
        "registry.example.com/frscope/frscope@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FRSCOPE_SIDECAR_IMAGE"] == "registry.example.com/frscope/frscope-sidecar:0.1.0-debug"
    assert env["FRSCOPE_SIDECAR_STALL_AFTER"] == "30"
    assert env["FRSCOPE_SIDECAR_METRICS_DETAIL"] == "rank-group"
    default_container = _deployment_pod(rendered["defaults"])["spec"]["containers"][0]
    default_env = {e["name"]: e.get("value") for e in default_container["env"]}
    assert default_env["FRSCOPE_SIDECAR_IMAGE"] == "ghcr.io/frscope/frscope:0.1.0"
    assert json.loads(default_env["FRSCOPE_SIDECAR_RESOURCES"])["limits"]["memory"] == "128Mi"
    # The sidecar's own defaults, stated by the chart: probe every 2 s, suspected after 4-15 s.
    assert (default_env["FRSCOPE_SIDECAR_POLL_INTERVAL"], default_env["FRSCOPE_SIDECAR_SUSPECT_AFTER"],
            default_env["FRSCOPE_SIDECAR_SUSPECT_MIN"]) == ("2", "15", "4")
    # One straggler threshold for the sidecars (their pod's ranks) and the operator (the pods).
    assert default_env["FRSCOPE_SIDECAR_STRAGGLER_MIN_SHARE"] == "0.1"
    assert "--straggler-min-share=0.1" in default_container["args"]
    # The sidecars' collective series aggregated over each pod unless asked (issue 35).
    assert default_env["FRSCOPE_SIDECAR_METRICS_DETAIL"] == "pod"
    # The injected sidecar's own non-root user and group, whatever the pod says (issue 34).
    assert (default_env["FRSCOPE_SIDECAR_RUN_AS_USER"], default_env["FRSCOPE_SIDECAR_RUN_AS_GROUP"]) == (
        "65532", "65532")


# --- the values schema -------------------------------------------------------------------------------

BAD_VALUES = [
    (["replicaCount=2"], r"additional properties 'replicaCount' not allowed"),
    (["operator.logLevl=debug"], r"additional properties 'logLevl' not allowed"),
    (["webhook.failurePolicy=Fail"], r"additional properties 'failurePolicy' not allowed"),
    (["operator.logLevel=verbose"], r"operator.logLevel.*value must be one of"),
    (["image.digest=latest"], r"image.digest.*does not match pattern"),
    (["sidecar.port=70000"], r"sidecar.port.*maximum"),
    (["sidecar.stragglerMinShare=0"], r"sidecar.stragglerMinShare.*exclusiveMinimum"),
    (["sidecar.metricsDetail=rank"], r"sidecar.metricsDetail.*value must be one of"),
    (["podMonitor.interval=fast"], r"podMonitor.interval.*does not match pattern"),
    (["operator.watchNamespaces[0]=Team_A"], r"operator.watchNamespaces.*does not match pattern"),
    (["webhook.injectLabel.value=not a label"], r"webhook.injectLabel.value.*does not match pattern"),
    (["sidecar.runAsUser=0"], r"sidecar.runAsUser.*minimum"),  # never root
    (["podMonitor.sampleLimit=-1"], r"podMonitor.sampleLimit.*minimum"),
]


@pytest.mark.parametrize(("sets", "message"), BAD_VALUES, ids=[s[0] for s, _ in BAD_VALUES])
def test_schema_rejects_bad_values_with_a_clear_message(helm: Helm, sets: list[str], message: str) -> None:
    args = ["template", "frs", str(CHART)]
    for s in sets:
        args += ["--set", s]
    proc = helm.run(*args, check=False)
    assert proc.returncode != 0, f"--set {sets} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert re.search(message, proc.stderr), proc.stderr


def test_auth_none_leaves_out_the_tokens(helm: Helm) -> None:
    objs = objects(helm, sets=["auth.sidecars=none", "sidecar.tls.enabled=false"])
    container = _deployment_pod(objs)["spec"]["containers"][0]
    assert "--sidecar-auth=none" in container["args"]
    assert not [a for a in container["args"] if a.startswith(("--sidecar-token-file", "--sidecar-ca-dir"))]
    assert "FRSCOPE_OPERATOR_IDENTITY" not in {e["name"] for e in container["env"]}
    # TLS needs the pods' own tokens (a certificate names the pod its token proves): said, not ignored.
    proc = helm.run("template", "frs", str(CHART), "--set", "auth.sidecars=none", check=False)
    assert proc.returncode != 0 and "sidecar.tls.enabled needs auth.sidecars=kubernetes" in proc.stderr


def test_service_account_name_is_required_when_not_created(helm: Helm) -> None:
    proc = helm.run("template", "frs", str(CHART), "--set", "serviceAccount.create=false", check=False)
    assert proc.returncode != 0
    assert "serviceAccount.name is required" in proc.stderr
    objs = objects(helm, sets=["serviceAccount.create=false", "serviceAccount.name=shared"])
    assert "ServiceAccount" not in _kinds(objs)
    assert one(objs, "ClusterRoleBinding", OPERATOR_ROLE)["subjects"][0]["name"] == "shared"
    assert one(objs, "ClusterRoleBinding", LEDGER_ROLE)["subjects"][0]["name"] == "shared"


def test_the_node_ledgers_rbac_and_flags_follow_its_values(helm: Helm) -> None:
    """On by default: nodes read and its own FlightRecorderNodes, never nodes patched; fencing `cordon`
    adds nodes patch; a Role in `default` reads the kubelet's node Events (node-OOM evidence), and with
    watched namespaces writes its own there; off: nothing."""
    def ledger_rules(objs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        role = one(objs, "ClusterRole", LEDGER_ROLE)
        return {(g, r, v) for rule in _rules(role) for g in rule["apiGroups"] for r in rule["resources"]
                for v in rule["verbs"]}

    def args(objs: list[dict[str, Any]]) -> list[str]:
        return list(_deployment_pod(objs)["spec"]["containers"][0]["args"])

    defaults = objects(helm, sets=[])
    granted = ledger_rules(defaults)
    assert {r for _, r, _ in granted} == {"nodes", "flightrecordernodes"}
    assert {v for _, r, v in granted if r == "nodes"} == {"get", "list"}
    assert "--node-ledger=on" in args(defaults) and "--node-fencing=dry-run" in args(defaults)
    assert "--node-fence-taint=off" in args(defaults)
    fencing = objects(helm, sets=["nodeLedger.fencing.mode=cordon", "nodeLedger.fencing.taint=true",
                                  "operator.watchNamespaces={team-a}"])
    assert ("", "nodes", "patch") in ledger_rules(fencing)
    assert "--node-fencing=cordon" in args(fencing) and "--node-fence-taint=on" in args(fencing)
    events = one(fencing, "Role", "frs-frscope-operator-ledger-events")
    assert events["metadata"]["namespace"] == "default"
    assert _rules(events) == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "list"]}]
    cluster_wide = one(defaults, "Role", "frs-frscope-operator-ledger-events")
    assert _rules(cluster_wide) == [{"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}]
    off = objects(helm, sets=["nodeLedger.enabled=false"])
    assert not [o for o in off if "ledger" in o["metadata"]["name"]]
    assert "--node-ledger=off" in args(off) and not [a for a in args(off) if a.startswith("--node-fenc")]
    bad = helm.run("template", "frs", str(CHART), "--set", "nodeLedger.fencing.mode=always", check=False)
    assert bad.returncode != 0 and "nodeLedger" in bad.stderr


def test_kube_version_floor_is_the_oldest_release_the_matrix_runs(helm: Helm) -> None:
    """Chart.yaml's kubeVersion admits the releases tests/e2e/test_kube_versions.py runs and nothing
    older: helm refuses the minor below the oldest and renders every release of the matrix."""
    oldest = kube_matrix.oldest_release()
    major, minor, _ = (int(part) for part in oldest.split("."))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={major}.{minor}.0-0"
    below = helm.run("template", "frs", str(CHART), "--kube-version", f"v{major}.{minor - 1}.99", check=False)
    assert below.returncode != 0 and f"incompatible with Kubernetes v{major}.{minor - 1}.99" in below.stderr, below
    for release in kube_matrix.releases():
        helm.run("template", "frs", str(CHART), "--kube-version", f"v{release}")
