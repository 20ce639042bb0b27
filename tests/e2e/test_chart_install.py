"""charts/frscope installed with the real helm into the real API server from testenv: the CRD registers,
every object is accepted (the Prometheus Operator's objects too, validated against its CRDs taken from
the Go module cache), an upgrade keeps the webhook certificate, the webhook fails open, and
`kubectl auth can-i --as` the operator's ServiceAccount shows it can do what the operator needs and
nothing beyond it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.chart_tools import CHART, VALUES_SETS, Helm, values_args
except ModuleNotFoundError:
    from chart_tools import CHART, VALUES_SETS, Helm, values_args

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# The Prometheus Operator CRDs (PodMonitor, ServiceMonitor, PrometheusRule) are third-party: read from
# the module cache (fetched through the Go module proxy, checked against the checksum database), never
# copied into this repository.
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
PROMETHEUS_OPERATOR_CRDS = [
    f"example/prometheus-operator-crd/monitoring.coreos.com_{name}.yaml"
    for name in ("podmonitors", "servicemonitors", "prometheusrules")
]
REPORT_CRD = CHART / "crds" / "flightrecorderreport.yaml"


@dataclass
class Install:
    release: str
    namespace: str
    service_account: str
    helm: Helm
    notes: str

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def _suffix() -> str:
    return secrets.token_hex(3)


@pytest.fixture(scope="module")
def helm(kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(kube.bin_dir / "helm", tmp_path_factory.mktemp("helm-home"), kube.kubeconfig)


def _create_namespace(kube: ControlPlane, name: str) -> None:
    kube.kubectl("create", "namespace", name)


def _delete_namespaces(kube: ControlPlane, *names: str) -> None:
    for name in names:
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@contextlib.contextmanager
def _install(helm: Helm, kube: ControlPlane, values: str, *, sets: tuple[str, ...] = (),
             namespaces: tuple[str, ...] = ()) -> Iterator[Install]:
    """`helm install` into a fresh namespace; `helm uninstall` and the namespaces deleted afterwards."""
    suffix = _suffix()
    release = f"frs{suffix}"
    namespace = f"frscope-{suffix}"
    _create_namespace(kube, namespace)
    for ns in namespaces:
        _create_namespace(kube, ns)
    out = helm.run("install", release, str(CHART), "--namespace", namespace, *values_args(values, sets),
                   timeout=180).stdout
    try:
        yield Install(release, namespace, f"{release}-frscope", helm, out.partition("NOTES:")[2])
    finally:
        helm.run("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s", check=False)
        _delete_namespaces(kube, namespace, *namespaces)


@pytest.fixture(scope="module")
def installed(helm: Helm, kube: ControlPlane) -> Iterator[Install]:
    """The chart with its defaults (cluster-wide operator, webhook, dashboard)."""
    with _install(helm, kube, "defaults") as install:
        yield install


def _get(kube: ControlPlane, *args: str) -> Any:
    return kube.kubectl_json("get", *args)


def _wait_for(what: str, probe: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


def test_report_crd_registers(kube: ControlPlane, installed: Install) -> None:
    assert REPORT_CRD.is_file(), f"{REPORT_CRD} is missing (the operator's CRD)"
    crd = json.loads(
        kube.kubectl("create", "--dry-run=client", "-o", "json", "-f", str(REPORT_CRD)).stdout
    )
    name = crd["metadata"]["name"]
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}", timeout=70)
    stored = _get(kube, "crd", name)
    assert stored["spec"]["group"] == crd["spec"]["group"]
    # The RBAC names the group the CRD really has.
    role = _get(kube, "clusterrole", f"{installed.release}-frscope-operator")
    groups = {g for rule in role["rules"] if "flightrecorderreports" in rule["resources"] for g in rule["apiGroups"]}
    assert groups == {crd["spec"]["group"]}
    plural = crd["spec"]["names"]["plural"]
    listed = kube.kubectl_json("get", f"{plural}.{crd['spec']['group']}", "-A")
    assert listed["kind"] == "List"


def test_describe_prints_each_culprit_frame_on_its_own_line(kube: ControlPlane, installed: Install,
                                                              tmp_path: Path) -> None:
    """A report built from a real hang, stored through the chart's CRD: `kubectl describe` keeps each
    frame of the culprit's stack on its own, indented line."""
    from frscope.analysis import AnalysisOptions, analyze
    from frscope.operator.model.objects import JobRef
    from frscope.operator.publish import build_report_cr
    from frscope.records import load_dumps

    report = analyze(load_dumps([Path(__file__).parents[1] / "data" / "real" / "hang"]),
                     AnalysisOptions(stall_after_s=0.5))
    obj = build_report_cr(JobRef(installed.namespace, "train", str(uuid.uuid4())), report, incident="abc123",
                          attempt="x/r0", signal="SidecarStall: x", missing_pods={},
                          gathered_at="2026-01-01T00:00:00Z")
    obj["metadata"].pop("ownerReferences", None)  # no such job here; the object stands alone
    path = tmp_path / "frr.json"
    path.write_text(json.dumps(obj))
    kube.kubectl("create", "-f", str(path))
    described = kube.kubectl("describe", "frr", obj["metadata"]["name"], "-n", installed.namespace).stdout
    lines = described.split("Culprit Stacks:", 1)[1].splitlines()
    frames = [line for line in lines if line.strip().startswith("load_batch (")]
    assert frames, described
    label = next(i for i, line in enumerate(lines) if "(live stack" in line or "(stack when" in line)
    # The label and the frames start at the same column, one per line.
    assert all(len(f) - len(f.lstrip()) == len(lines[label]) - len(lines[label].lstrip()) for f in frames)


def test_every_object_is_stored(kube: ControlPlane, installed: Install) -> None:
    ns, rel = installed.namespace, installed.release
    full = f"{rel}-frscope"
    deploy = _get(kube, "deployment", full, "-n", ns)
    assert deploy["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert _get(kube, "service", full, "-n", ns)["spec"]["ports"]
    assert _get(kube, "serviceaccount", full, "-n", ns)
    assert _get(kube, "configmap", f"{full}-dashboard", "-n", ns)["metadata"]["labels"]["grafana_dashboard"] == "1"
    secret = _get(kube, "secret", f"{full}-webhook-tls", "-n", ns)
    mwc = _get(kube, "mutatingwebhookconfiguration", full)
    assert mwc["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert _get(kube, "clusterrolebinding", f"{full}-operator")["subjects"][0]["name"] == full
    # Restricted Pod Security admits the operator's pod template: a server-side dry run of a pod with
    # that spec in a namespace that enforces the restricted level.
    enforced = f"pss-{_suffix()}"
    _create_namespace(kube, enforced)
    try:
        kube.kubectl("label", "namespace", enforced, "pod-security.kubernetes.io/enforce=restricted")
        template = deploy["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "operator", "namespace": enforced},
               "spec": {**template["spec"], "serviceAccountName": "default",
                        "volumes": [v for v in template["spec"]["volumes"] if "secret" not in v]}}
        kept = {v["name"] for v in pod["spec"]["volumes"]}
        pod["spec"]["containers"] = [
            {**c, "volumeMounts": [m for m in c["volumeMounts"] if m["name"] in kept]}
            for c in pod["spec"]["containers"]
        ]
        _wait_for("the default service account", lambda: kube.kubectl(
            "get", "serviceaccount", "default", "-n", enforced, check=False).returncode == 0)
        proc = kube.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        assert proc.returncode == 0, proc.stderr
        assert "violate" not in proc.stderr, proc.stderr
    finally:
        _delete_namespaces(kube, enforced)


def test_notes_say_how_to_opt_in_and_where_to_look(installed: Install) -> None:
    notes = installed.notes
    assert 'frscope.io/inject: "true"' in notes
    assert f"kubectl -n {installed.namespace} rollout status deployment/{installed.release}-frscope" in notes
    assert f"helm test {installed.release} -n {installed.namespace} --logs" in notes
    assert "kubectl describe pytorchjob -n <namespace> <job>" in notes
    assert "kubectl get flightrecorderreports -n <namespace>" in notes
    assert f"{installed.release}-frscope-dashboard, labelled grafana_dashboard=\"1\"" in notes
    assert "podMonitor.enabled=true" in notes  # how to turn metrics on
    # Every job kind, and the opt-in rule as the webhook applies it: with namespaceOptIn (the default) the
    # job pods of a labelled namespace are injected without a label of their own.
    assert "The operator watches PyTorchJobs, TrainJobs, JobSets in all namespaces" in notes
    assert "spec.pytorchReplicaSpecs.<Master|Worker>.template.metadata.labels:" in notes
    assert "spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[].template.spec.template" in notes
    assert "spec.replicatedJobs[].template.spec.template.metadata.labels:" in notes
    assert "belong to a PyTorchJob, TrainJob, JobSet in a namespace labelled frscope.io/inject=true" in notes
    assert "kubectl label namespace <namespace> frscope.io/inject=true" in notes
    assert 'labelled or not, unless it carries\n     frscope.io/inject: "false"' in notes  # the pod's opt-out
    assert "never touched" in notes and "kube-system" in notes
    assert "unlabeled pods are never touched" not in notes.lower()
    assert "anyone who may view the namespace may list them" in notes
    assert "No policy is written into training namespaces" in notes


def test_a_namespace_viewer_lists_the_reports(kube: ControlPlane, installed: Install) -> None:
    """README's `kubectl get flightrecorderreports` for the people who run the jobs: Kubernetes' view role
    (bound in their namespace) aggregates the chart's read rule, edit its delete; the node ledger stays out."""
    ns = f"ml-{_suffix()}"
    _create_namespace(kube, ns)
    try:
        for who, role in (("alice", "view"), ("bob", "edit")):
            kube.kubectl("create", "rolebinding", f"{who}-{role}", f"--clusterrole={role}", f"--user={who}",
                         "-n", ns)

        def aggregated() -> bool:
            return _can_i(kube, "alice", "list", REPORTS, "-n", ns)

        _wait_for("the view role to aggregate the reports", aggregated, 60)
        for verb in ("get", "list", "watch"):
            assert _can_i(kube, "alice", verb, REPORTS, "-n", ns)
            assert _can_i(kube, "bob", verb, REPORTS, "-n", ns)
        assert not _can_i(kube, "alice", "delete", REPORTS, "-n", ns)
        _wait_for("the edit role to aggregate the delete", lambda: _can_i(kube, "bob", "delete", REPORTS, "-n", ns))
        for who in ("alice", "bob"):
            assert not _can_i(kube, who, "create", REPORTS, "-n", ns)  # only the operator writes reports
            assert not _can_i(kube, who, "list", REPORTS, "-n", "default")  # only where they are bound
            assert not _can_i(kube, who, "list", LEDGER)
        # For real, as alice: the list request the README's command makes.
        proc = kube.kubectl("get", "flightrecorderreports", "-n", ns, "--as=alice", check=False)
        assert proc.returncode == 0, proc.stderr
    finally:
        _delete_namespaces(kube, ns)


def test_upgrade_keeps_the_webhook_certificate(kube: ControlPlane, installed: Install) -> None:
    full = f"{installed.release}-frscope"
    before = _get(kube, "secret", f"{full}-webhook-tls", "-n", installed.namespace)["data"]
    ca_before = _get(kube, "secret", f"{full}-sidecar-ca", "-n", installed.namespace)["data"]
    installed.helm.run("upgrade", installed.release, str(CHART), "--namespace", installed.namespace,
                       "--set", "operator.logLevel=debug", timeout=180)
    after = _get(kube, "secret", f"{full}-webhook-tls", "-n", installed.namespace)["data"]
    assert after == before
    # The sidecars' CA too: certificates it issued before the upgrade stay trusted.
    assert _get(kube, "secret", f"{full}-sidecar-ca", "-n", installed.namespace)["data"] == ca_before
    mwc = _get(kube, "mutatingwebhookconfiguration", full)
    assert mwc["webhooks"][0]["clientConfig"]["caBundle"] == before["ca.crt"]
    deploy = _get(kube, "deployment", full, "-n", installed.namespace)
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--log-level=debug" in args


def test_webhook_fails_open_and_ignores_pods_without_the_label(kube: ControlPlane, installed: Install) -> None:
    """No operator runs here (no kubelet): the API server cannot reach the webhook, and pods are created
    anyway, unchanged, with and without the opt-in label."""
    ns = f"work-{_suffix()}"
    _create_namespace(kube, ns)
    try:
        _wait_for("the default service account", lambda: kube.kubectl(
            "get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0)
        for name, labels in (("opted-in", {"frscope.io/inject": "true"}), ("plain", {})):
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": ns, "labels": labels},
                   "spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]}}
            started = time.monotonic()
            created = kube.kubectl_json("create", "-f", "-", input=json.dumps(pod))
            assert time.monotonic() - started < 30
            assert [c["name"] for c in created["spec"]["containers"]] == ["pytorch"]
            assert not created["spec"].get("initContainers")
    finally:
        _delete_namespaces(kube, ns)


def _can_i(kube: ControlPlane, user: str, verb: str, resource: str, *args: str) -> bool:
    proc = kube.kubectl("auth", "can-i", verb, resource, f"--as={user}", *args, check=False)
    answer = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert answer in ("yes", "no"), f"can-i {verb} {resource} {args}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


JOBS = "pytorchjobs.kubeflow.org"
REPORTS = "flightrecorderreports.frscope.io"
LEDGER = "flightrecordernodes.frscope.io"
CRDS = "customresourcedefinitions.apiextensions.k8s.io"

# What the operator needs (docs/install.md, "Permissions"): (verb, resource, extra kubectl args).
NEEDED = [
    *[(v, JOBS, ()) for v in ("get", "list", "watch")],
    ("patch", JOBS, ("--subresource=status",)),
    ("create", "tokenreviews.authentication.k8s.io", ()),
    ("create", "subjectaccessreviews.authorization.k8s.io", ()),
    *[(v, "pods", ()) for v in ("get", "list", "watch")],
    ("list", JOBS, ("--all-namespaces",)),
    ("watch", "pods", ("--all-namespaces",)),
    ("create", "events", ()),
    ("patch", "events", ()),
    ("create", "events.events.k8s.io", ()),
    *[(v, REPORTS, ()) for v in ("get", "list", "watch", "create", "update", "patch", "delete")],
    ("list", CRDS, ()),
    ("watch", CRDS, ()),
    # The node ledger (nodeLedger.enabled, on by default): implicated nodes read, its own objects.
    *[(v, "nodes", ()) for v in ("get", "list")],
    *[(v, LEDGER, ()) for v in ("get", "list", "watch", "create", "update", "patch", "delete")],
]

# Things it must not be able to do.
BEYOND = [
    *[(v, "secrets", ()) for v in ("get", "list", "watch")],
    ("list", "secrets", ("--all-namespaces",)),
    ("get", "configmaps", ()),
    # The job itself is only read: frscope's bookkeeping lives in its reports.
    *[(v, JOBS, ()) for v in ("create", "update", "patch", "delete", "deletecollection")],
    ("update", JOBS, ("--subresource=status",)),
    *[(v, "pods", ()) for v in ("create", "update", "patch", "delete")],
    ("create", "pods", ("--subresource=exec",)),
    ("get", "pods", ("--subresource=log",)),
    ("create", "pods", ("--subresource=eviction",)),
    ("delete", "events", ()),
    *[(v, CRDS, ()) for v in ("get", "create", "update", "patch", "delete")],
    *[(v, "mutatingwebhookconfigurations.admissionregistration.k8s.io", ()) for v in ("get", "patch", "create")],
    ("create", "clusterroles.rbac.authorization.k8s.io", ()),
    ("create", "rolebindings.rbac.authorization.k8s.io", ()),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", ()),
    ("bind", "clusterroles.rbac.authorization.k8s.io", ()),
    ("impersonate", "users", ()),
    ("impersonate", "serviceaccounts", ()),
    ("create", "serviceaccounts", ("--subresource=token",)),
    # Fencing a node is opt-in (nodeLedger.fencing.mode cordon, or the cordon action).
    *[(v, "nodes", ()) for v in ("patch", "update", "delete")],
    ("list", "namespaces", ()),
    ("create", "namespaces", ()),
    ("create", "leases.coordination.k8s.io", ()),
    ("list", "clusterkopfpeerings.kopf.dev", ()),
    ("create", "deployments.apps", ()),
    ("*", "*", ()),
]


def test_operator_can_do_what_it_needs(kube: ControlPlane, installed: Install) -> None:
    for ns in ("default", installed.namespace, "some-team"):
        cant = [(v, r, a) for v, r, a in NEEDED if not _can_i(kube, installed.user, v, r, "-n", ns, *a)]
        assert not cant, f"{installed.user} cannot {cant} in {ns}"
    # Per-pod tokens for the sidecars: tokens of its own account, in its own namespace, and no other.
    own = f"serviceaccounts/{installed.service_account}"
    assert _can_i(kube, installed.user, "create", own, "-n", installed.namespace, "--subresource=token")
    assert not _can_i(kube, installed.user, "create", "serviceaccounts/default", "-n", installed.namespace,
                      "--subresource=token")
    assert not _can_i(kube, installed.user, "create", own, "-n", "some-team", "--subresource=token")


def test_operator_can_do_nothing_beyond(kube: ControlPlane, installed: Install) -> None:
    for ns in ("default", installed.namespace, "kube-system"):
        can = [(v, r, a) for v, r, a in BEYOND if _can_i(kube, installed.user, v, r, "-n", ns, *a)]
        assert not can, f"{installed.user} can {can} in {ns}"


# Granted to every authenticated user by the API server's bootstrap policy (system:basic-user,
# system:discovery, system:public-info-viewer): not the chart's doing.
BOOTSTRAP = {
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
    "selfsubjectreviews.authentication.k8s.io",
}


def _rules_list(kube: ControlPlane, user: str, namespace: str) -> dict[str, set[str]]:
    """`kubectl auth can-i --list`: resource (with `[names]` when limited to names) -> verbs. The
    bootstrap rules are left out; non-resource URLs (discovery, health) must be read-only."""
    out = kube.kubectl("auth", "can-i", "--list", f"--as={user}", "-n", namespace, "--no-headers").stdout
    table: dict[str, set[str]] = {}
    for line in out.splitlines():
        if not line.strip():
            continue
        if line[0].isspace():  # a non-resource URL row: [/api] [] [get]
            assert line.split()[-1] == "[get]", line
            continue
        match = re.fullmatch(r"(\S+)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*", line)
        assert match, line
        resource, _urls, resource_names, verbs = match.groups()
        if resource in BOOTSTRAP:
            continue
        key = f"{resource}[{resource_names}]" if resource_names else resource
        table.setdefault(key, set()).update(verbs.split())
    return table


def test_the_whole_rule_set_is_exactly_the_needed_one(kube: ControlPlane, installed: Install) -> None:
    table = _rules_list(kube, installed.user, "some-team")
    assert table == {
        JOBS: {"get", "list", "watch"},
        f"{JOBS}/status": {"patch"},
        # TrainJob and JobSet are watched by default (operator.jobKinds): read, and the status condition.
        "trainjobs.trainer.kubeflow.org": {"get", "list", "watch"},
        "trainjobs.trainer.kubeflow.org/status": {"patch"},
        "jobsets.jobset.x-k8s.io": {"get", "list", "watch"},
        "jobsets.jobset.x-k8s.io/status": {"patch"},
        "tokenreviews.authentication.k8s.io": {"create"},
        "subjectaccessreviews.authorization.k8s.io": {"create"},
        "pods": {"get", "list", "watch"},
        "events": {"create", "patch"},
        "events.events.k8s.io": {"create", "patch"},
        REPORTS: {"get", "list", "watch", "create", "update", "patch", "delete"},
        CRDS: {"list", "watch"},
        "nodes": {"get", "list"},
        LEDGER: {"get", "list", "watch", "create", "update", "patch", "delete"},
        # No NetworkPolicy rights: by default nobody writes the sidecars' policy into training namespaces
        # (networkPolicy.sidecars.addToNamespacesWithPolicies; test_sidecar_policy_e2e.py).
    }


def _run_operator_until_ready(kube: ControlPlane, install: Install, tmp_path: Path, *args: str) -> str:
    """`frscope operator` as its own process with a token of the chart's ServiceAccount: until /readyz
    answers and a few seconds more; returns its log. Ended by PID."""
    token = kube.kubectl("create", "token", install.service_account, "-n", install.namespace,
                         "--duration=10m").stdout.strip()
    kubeconfig = kube.write_token_kubeconfig(tmp_path / "operator.kubeconfig", token, install.user)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path / "operator.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "frscope", "operator", "--http-host", "127.0.0.1", "--http-port", str(port),
             "--log-level", "DEBUG", *args],
            env={**kube.env(), "KUBECONFIG": str(kubeconfig)}, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            def ready() -> bool:
                assert proc.poll() is None, log_path.read_text()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                        return bool(response.status == 200)
                except OSError:
                    return False

            _wait_for("the operator's /readyz", ready, 60)
            time.sleep(3)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    return log_path.read_text()


def test_namespaced_install_is_limited_to_its_namespaces(helm: Helm, kube: ControlPlane, tmp_path: Path) -> None:
    team_a, team_b, other = (f"team-{_suffix()}" for _ in range(3))
    _create_namespace(kube, other)
    try:
        with _install(helm, kube, "monitoring-off", namespaces=(team_a, team_b), sets=(
                f"operator.watchNamespaces[0]={team_a}", f"operator.watchNamespaces[1]={team_b}",
                "networkPolicy.enabled=true", f"networkPolicy.namespaces[0]={team_a}",
                f"networkPolicy.namespaces[1]={team_b}")) as install:
            user = install.user
            assert "The webhook is off" in install.notes and "docs/install.md" in install.notes
            assert "grafana_dashboard" not in install.notes
            for ns in (team_a, team_b):
                assert _can_i(kube, user, "watch", JOBS, "-n", ns)
                assert _can_i(kube, user, "patch", JOBS, "-n", ns, "--subresource=status")
                assert _can_i(kube, user, "create", REPORTS, "-n", ns)
                assert not _can_i(kube, user, "get", "secrets", "-n", ns)
            for ns in (other, install.namespace, "default"):
                assert not _can_i(kube, user, "watch", JOBS, "-n", ns)
                assert not _can_i(kube, user, "list", "pods", "-n", ns)
                # The node ledger's node Events live in `default` (a Role there), nowhere else outside.
                assert _can_i(kube, user, "create", "events", "-n", ns) is (ns == "default")
            assert not _can_i(kube, user, "list", JOBS, "--all-namespaces")
            # kopf's namespace observer (watching a list of namespaces): read-only.
            assert _can_i(kube, user, "watch", "namespaces")
            assert not _can_i(kube, user, "create", "namespaces")
            assert _rules_list(kube, user, other) == {CRDS: {"list", "watch"}, "namespaces": {"list", "watch"},
                                                      "tokenreviews.authentication.k8s.io": {"create"},
                                                      "subjectaccessreviews.authorization.k8s.io": {"create"},
                                                      "nodes": {"get", "list"},
                                                      LEDGER: {"get", "list", "watch", "create", "update",
                                                               "patch", "delete"}}
            # The sidecars' NetworkPolicy is accepted in each named training namespace: one rule, the sidecar port.
            for ns in (team_a, team_b):
                policy = _get(kube, "networkpolicy", f"{install.release}-frscope-sidecar", "-n", ns)
                [rule] = policy["spec"]["ingress"]
                assert rule["ports"] == [{"protocol": "TCP", "port": 9402}] and len(rule["from"]) == 2
            # Nothing of the webhook is installed with it off.
            assert kube.kubectl("get", "mutatingwebhookconfiguration", f"{install.release}-frscope",
                                check=False).returncode != 0
            # The real operator, with a token of the chart's ServiceAccount, starts and watches the two
            # namespaces with these rules and no more.
            log = _run_operator_until_ready(kube, install, tmp_path, "--namespace", team_a, "--namespace", team_b)
            for ns in (team_a, team_b):
                assert f"Starting the watch-stream for pytorchjobs.v1.kubeflow.org in '{ns}'" in log, log
                assert f"Starting the watch-stream for pods.v1 in '{ns}'" in log, log
            # Messages only: a line's timestamp can end in ",403" (milliseconds), which is no HTTP status.
            messages = re.sub(r"^\S+ \d\d:\d\d:\d\d,\d+ ", "", log, flags=re.M)
            assert not re.search(r"forbidden|\b403\b|not enough permissions", messages, re.I), log
    finally:
        _delete_namespaces(kube, other)


def _prometheus_operator_crds() -> tuple[list[Path], str]:
    """The three CRDs from the module cache, downloading the module through the Go module proxy if
    needed; ([], reason) when that is impossible (no Go, no network and nothing cached)."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if go is None:
        return [], "Go is not installed, so the Prometheus Operator CRDs cannot be read from the module cache"
    with tempfile.TemporaryDirectory() as scratch:  # outside any module: no go.mod is touched
        proc = subprocess.run([go, "mod", "download", "-json", PROMETHEUS_OPERATOR], cwd=scratch,
                              capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        return [], f"go mod download {PROMETHEUS_OPERATOR} failed: {(proc.stdout + proc.stderr).strip()[-500:]}"
    moddir = Path(json.loads(proc.stdout)["Dir"])
    paths = [moddir / p for p in PROMETHEUS_OPERATOR_CRDS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        return [], f"{PROMETHEUS_OPERATOR} has no {missing}"
    return paths, ""


@pytest.mark.timeout(900)
def test_monitoring_objects_are_accepted_by_the_prometheus_operator_crds(helm: Helm, kube: ControlPlane) -> None:
    crds, reason = _prometheus_operator_crds()
    if not crds:
        pytest.skip(f"monitoring objects not applied: {reason} (test_chart.py still renders and lints them)")
    names = []
    for crd in crds:
        applied = kube.kubectl_json("apply", "--server-side", "--field-manager=frscope-e2e", "-f", str(crd))
        names.append(f"crd/{applied['metadata']['name']}")
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names, timeout=70)
    assert VALUES_SETS["install"]
    with _install(helm, kube, "install") as install:
        ns, full = install.namespace, f"{install.release}-frscope"
        pm = _get(kube, "podmonitors.monitoring.coreos.com", f"{full}-sidecars", "-n", ns)
        assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "frscope"
        assert _get(kube, "servicemonitors.monitoring.coreos.com", full, "-n", ns)["spec"]["endpoints"]
        rule = _get(kube, "prometheusrules.monitoring.coreos.com", full, "-n", ns)
        alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
        assert alerts == {"FrscopeOperatorDown", "FrscopePublishErrors", "FrscopeCollectiveStalled",
                          "FrscopeDiagnosisMade", "FrscopeSidecarDown"}
        assert f"PrometheusRule {full} (FrscopeOperatorDown, FrscopePublishErrors" in install.notes
        # The ServiceMonitor's `authorization` (the CRD's schema accepted it) names a token Secret that the
        # token controller fills, of an account that may get /metrics and nothing else.
        sm = _get(kube, "servicemonitors.monitoring.coreos.com", full, "-n", ns)
        credentials = sm["spec"]["endpoints"][0]["authorization"]["credentials"]
        assert credentials == {"name": f"{full}-metrics-reader", "key": "token"}
        _wait_for("the reader's token", lambda: (_get(kube, "secret", credentials["name"], "-n", ns).get("data")
                                                 or {}).get("token"))
        reader = f"system:serviceaccount:{ns}:{full}-metrics-reader"
        assert _can_i(kube, reader, "get", "/metrics")
        assert not _can_i(kube, reader, "list", "pods", "-A")
        # The API server validated them against the CRDs' schemas: a wrong field is rejected.
        broken = {**pm, "spec": {**pm["spec"], "podMetricsEndpoints": [{"port": 9402}]}}
        broken["metadata"] = {"name": "broken", "namespace": ns}
        proc = kube.kubectl("create", "-f", "-", input=json.dumps(broken), check=False)
        assert proc.returncode != 0 and "port" in proc.stderr, proc.stderr
