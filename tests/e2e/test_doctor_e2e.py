"""`frscope doctor` against the real API server from testenv, with the chart installed by the real helm:
a good setup passes every check; each setup broken one way fails the check that names it.

This tier has no kubelet: what a kubelet would do for the operator's pod (bind it to a node, report
it running and ready) is written here through the API server, so the Deployment and the Service's
EndpointSlice become what the real controllers make of a ready pod. The node tier (tests/node) runs
real pods."""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.test_chart_install import CHART, REPORT_CRD, Install, _install, _wait_for, helm
    from tests.e2e.test_operator_e2e import make_serving_cert
except ModuleNotFoundError:
    from test_chart_install import CHART, REPORT_CRD, Install, _install, _wait_for, helm
    from test_operator_e2e import make_serving_cert

from frscope.doctor.crd_schema import ANNOTATION, SHIPPED

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

__all__ = ["helm"]  # the fixture, imported for this module's tests

# Prometheus as the good setup names it: a NetworkPolicy peer besides frscope's own pods.
PROMETHEUS = "networkPolicy.prometheus.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring"


def doctor(kube: ControlPlane, *args: str, kubeconfig: Path | None = None,
           kubeconfig_env: str | None = None) -> tuple[int, dict[str, str], str]:
    """Run `frscope doctor`; returns (exit code, check name -> its outcome, the whole output). `kubeconfig_env`:
    no --kubeconfig, KUBECONFIG set to it (a list, as a user's shell has it)."""
    if kubeconfig_env is None:
        where, env = ["--kubeconfig", str(kubeconfig or kube.kubeconfig)], None
    else:
        where, env = [], {**os.environ, "KUBECONFIG": kubeconfig_env}
    proc = subprocess.run([sys.executable, "-m", "frscope", "doctor", *where, *args],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    outcomes = {}
    for line in proc.stdout.splitlines():
        if line.startswith("[") and "]" in line:
            outcome, _, rest = line[1:].partition("]")
            outcomes[rest.strip().partition(":")[0]] = outcome.strip()
    return proc.returncode, outcomes, proc.stdout + proc.stderr


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _run_operator_pod_as_a_kubelet_would(kube: ControlPlane, install: Install, node: str) -> None:
    """Bind the operator's pod to `node` and report it running and ready (no kubelet in this tier)."""
    kube.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    kube.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e",
                        "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}],
        "addresses": [{"type": "InternalIP", "address": "10.250.0.1"}]}}))
    selector = f"app.kubernetes.io/instance={install.release},app.kubernetes.io/component=operator"
    pods = _wait_for("the operator's pod", lambda: kube.kubectl_json("get", "pods", "-n", install.namespace,
                                                                     "-l", selector)["items"])
    pod = pods[0]
    name = pod["metadata"]["name"]
    status, _, body = kube.request("POST", f"/api/v1/namespaces/{install.namespace}/pods/{name}/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
    assert status == 201, body
    running = {"running": {"startedAt": _now()}}
    kube.kubectl("patch", "pod", name, "-n", install.namespace, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": {
                     "phase": "Running", "podIP": "10.250.0.2", "podIPs": [{"ip": "10.250.0.2"}],
                     "hostIP": "10.250.0.1", "startTime": _now(),
                     "conditions": [{"type": t, "status": "True", "lastTransitionTime": _now()}
                                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                     "containerStatuses": [{"name": c["name"], "ready": True, "started": True, "restartCount": 0,
                                            "image": c["image"], "imageID": "", "state": running}
                                           for c in pod["spec"]["containers"]]}}))


@pytest.fixture(scope="module")
def good(helm: Any, kube: ControlPlane) -> Iterator[Install]:
    node = f"doctor-{secrets.token_hex(3)}"
    with _install(helm, kube, "defaults", sets=(PROMETHEUS,)) as install:
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPORT_CRD))
        _run_operator_pod_as_a_kubelet_would(kube, install, node)
        try:
            yield install
        finally:
            kube.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def training_namespace(kube: ControlPlane) -> Iterator[str]:
    name = f"train-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def _ready(kube: ControlPlane, install: Install) -> None:
    def available() -> bool:
        dep = kube.kubectl_json("get", "deployment", "-n", install.namespace, "-l",
                                f"app.kubernetes.io/instance={install.release}")["items"][0]
        return any(c["type"] == "Available" and c["status"] == "True" for c in dep["status"].get("conditions", []))

    _wait_for("the operator Deployment available", available, timeout=30)


def test_a_good_setup_passes_every_check(kube: ControlPlane, good: Install, training_namespace: str) -> None:
    kube.kubectl("label", "namespace", training_namespace, "frscope.io/inject=true")
    _ready(kube, good)
    _wait_for("a ready endpoint for the webhook", lambda: doctor(kube)[1].get("webhook") == "ok", timeout=30)
    code, outcomes, out = doctor(kube, "--namespace", training_namespace)
    assert code == 0, out
    assert outcomes == {"kubernetes-version": "ok", "operator": "ok", "webhook": "ok", "webhook-ca": "ok",
                        "crd": "ok", "network-policy": "ok", "sidecar-tls": "ok", "opt-in": "ok", "injected": "skip",
                        "sidecars": "skip", "ranks-served": "skip", "operator-reach": "ok"}, out
    assert "all checks passed" in out


def test_a_namespace_not_labelled_fails_opt_in(kube: ControlPlane, good: Install, training_namespace: str) -> None:
    code, outcomes, out = doctor(kube, "--namespace", training_namespace, "--job", "llm")
    assert code == 1, out
    assert outcomes["opt-in"] == "FAIL", out
    assert f"kubectl label namespace {training_namespace} frscope.io/inject=true" in out


def test_a_pod_the_webhook_never_saw_fails_injected(kube: ControlPlane, good: Install, training_namespace: str) -> None:
    kube.kubectl("label", "namespace", training_namespace, "frscope.io/inject=true")
    # Created while the namespace is labelled, but it only carries the label: no sidecar, no annotation
    # (the webhook answered from no real pod: it fails open, as pods then start without frscope).
    kube.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "llm-worker-0", "namespace": training_namespace,
                     "labels": {"training.kubeflow.org/job-name": "llm", "frscope.io/inject": "true"}},
        "spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]}}), timeout=90)
    code, outcomes, out = doctor(kube, "--namespace", training_namespace, "--job", "llm")
    assert code == 1, out
    assert outcomes["opt-in"] == "ok" and outcomes["injected"] == "FAIL", out
    assert "llm-worker-0" in out


def _webhook_configuration(kube: ControlPlane, install: Install) -> dict[str, Any]:
    [config] = kube.kubectl_json("get", "mutatingwebhookconfigurations", "-l",
                                 f"app.kubernetes.io/instance={install.release}")["items"]
    return config  # type: ignore[no-any-return]


def test_a_wrong_ca_bundle_fails_webhook_ca(kube: ControlPlane, good: Install, tmp_path: Path) -> None:
    config = _webhook_configuration(kube, good)
    original = [hook["clientConfig"]["caBundle"] for hook in config["webhooks"]]
    other_ca = base64.b64encode(make_serving_cert(tmp_path / "other")).decode()
    patch = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": other_ca}
             for i in range(len(original))]
    name = config["metadata"]["name"]
    kube.kubectl("patch", "mutatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(patch))
    try:
        code, outcomes, out = doctor(kube)
        assert code == 1, out
        assert outcomes["webhook-ca"] == "FAIL", out
        assert "the caBundle did not sign the serving certificate" in out
    finally:
        restore = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca}
                   for i, ca in enumerate(original)]
        kube.kubectl("patch", "mutatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(restore))
    assert doctor(kube)[1]["webhook-ca"] == "ok"


def test_a_missing_webhook_service_fails_webhook(kube: ControlPlane, good: Install) -> None:
    service = kube.kubectl_json("get", "service", "-n", good.namespace, "-l",
                                f"app.kubernetes.io/instance={good.release}")["items"][0]
    kube.kubectl("delete", "service", "-n", good.namespace, service["metadata"]["name"])
    try:
        code, outcomes, out = doctor(kube)
        assert code == 1, out
        assert outcomes["webhook"] == "FAIL", out
        assert "does not exist" in out
    finally:
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            service["metadata"].pop(key, None)
        service["spec"].pop("clusterIP", None)
        service["spec"].pop("clusterIPs", None)
        service.pop("status", None)
        kube.apply(service)


def test_a_missing_crd_fails_crd(kube: ControlPlane, good: Install) -> None:
    kube.kubectl("delete", "-f", str(REPORT_CRD), "--wait=true", timeout=90)
    try:
        code, outcomes, out = doctor(kube)
        assert code == 1, out
        assert outcomes["crd"] == "FAIL", out
        assert "kubectl apply --server-side --force-conflicts" in out
    finally:
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPORT_CRD))
        kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPORT_CRD), timeout=70)
    assert doctor(kube)[1]["crd"] == "ok"


def test_a_policy_without_prometheus_fails_network_policy(kube: ControlPlane, good: Install) -> None:
    [policy] = [p for p in kube.kubectl_json("get", "networkpolicy", "-n", good.namespace)["items"]
                if p["metadata"]["name"].endswith("-operator")]
    peers = policy["spec"]["ingress"][0]["from"]
    own = [p for p in peers if "frscope.io/inject" in (p.get("podSelector") or {}).get("matchLabels", {})]
    name = policy["metadata"]["name"]
    kube.kubectl("patch", "networkpolicy", name, "-n", good.namespace, "--type=json", "-p",
                 json.dumps([{"op": "replace", "path": "/spec/ingress/0/from", "value": own}]))
    try:
        code, outcomes, out = doctor(kube)
        assert code == 1, out
        assert outcomes["network-policy"] == "FAIL", out
        assert "networkPolicy.prometheus" in out
    finally:
        kube.kubectl("patch", "networkpolicy", name, "-n", good.namespace, "--type=json", "-p",
                     json.dumps([{"op": "replace", "path": "/spec/ingress/0/from", "value": peers}]))


def test_an_unreachable_cluster_exits_2(kube: ControlPlane, tmp_path: Path) -> None:
    config = kube.write_token_kubeconfig(tmp_path / "kubeconfig", "nobody", "nobody")
    text = config.read_text().replace(kube.server, "https://127.0.0.1:1")
    config.write_text(text)
    started = time.monotonic()
    code, _, out = doctor(kube, kubeconfig=config)
    assert code == 2, out
    assert "cannot reach the API server https://127.0.0.1:1" in out
    assert time.monotonic() - started < 60


def test_a_stale_crd_schema_fails_crd_until_the_charts_crds_are_applied(kube: ControlPlane, good: Install,
                                                                         helm: Any) -> None:
    """After `helm upgrade` the served CRD keeps the schema of the first install (Helm never upgrades crds/):
    its schema-hash annotation is an older one here. Applying the chart's CRDs, as the fix says, heals it."""
    name = "flightrecorderreports.frscope.io"
    kube.kubectl("annotate", "crd", name, "--overwrite", f"{ANNOTATION}=0123456789abcdef")
    try:
        code, outcomes, out = doctor(kube)
        assert code == 1, out
        assert outcomes["crd"] == "FAIL", out
        assert "serves schema '0123456789abcdef'" in out and SHIPPED[name] in out, out
    finally:
        crds = helm.run("show", "crds", str(CHART)).stdout
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=crds)
    assert doctor(kube)[1]["crd"] == "ok"


# -- credentials as managed clusters hand them out: exec plugins, merged KUBECONFIG lists ---------------

CLUSTER_CHECKS = {"kubernetes-version", "operator", "webhook", "webhook-ca", "crd", "network-policy", "sidecar-tls"}


def _token_plugin(directory: Path, token: str) -> tuple[Path, Path]:
    """A real exec credential plugin (as `aws eks get-token` is): prints an ExecCredential with `token`, and
    notes each run in the returned file."""
    (directory / "token").write_text(token)
    runs = directory / "runs"
    plugin = directory / "credential-plugin"
    plugin.write_text(f"""#!{sys.executable}
import json, os
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
open({str(runs)!r}, "a").write("run\\n")
token = open({str(directory / "token")!r}).read()
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": {{"token": token}}}}))
""")
    plugin.chmod(0o755)
    return plugin, runs


def _cluster_and_context(kube: ControlPlane, user: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "e2e",
            "clusters": [{"name": "e2e", "cluster": {"server": kube.server,
                                                     "certificate-authority": str(kube.ca_file)}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}]}


def _exec_user(plugin: Path) -> dict[str, Any]:
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                     "interactiveMode": "Never", "provideClusterInfo": True}}


def _beat_as_a_kubelet_would(kube: ControlPlane, install: Install) -> None:
    """No kubelet heartbeats in this tier: once the node monitor's grace period is over (40 s) the node is
    NotReady and its pods unready. One more heartbeat for the operator pod's node, and the pod ready again."""
    selector = f"app.kubernetes.io/instance={install.release},app.kubernetes.io/component=operator"
    [pod] = kube.kubectl_json("get", "pods", "-n", install.namespace, "-l", selector)["items"]
    kube.kubectl("patch", "node", pod["spec"]["nodeName"], "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e",
                                    "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}}))
    kube.kubectl("patch", "pod", pod["metadata"]["name"], "-n", install.namespace, "--subresource=status",
                 "--type=merge", "-p", json.dumps({"status": {"conditions": [
                     {"type": t, "status": "True", "lastTransitionTime": _now()}
                     for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]}}))


def _checks_pass(kube: ControlPlane, good: Install, **where: Any) -> str:
    """Every cluster check passes with the credentials of `where`, once it does with the admin's (the operator's
    pod reported ready again; an earlier test recreated the webhook's Service, whose EndpointSlice follows)."""
    _beat_as_a_kubelet_would(kube, good)
    _ready(kube, good)
    _wait_for("a ready endpoint for the webhook", lambda: doctor(kube)[1].get("webhook") == "ok", timeout=120)
    code, outcomes, out = doctor(kube, **where)
    assert code == 0, out
    assert set(outcomes) == CLUSTER_CHECKS and set(outcomes.values()) == {"ok"}, out
    return out


def test_an_exec_plugin_kubeconfig_gets_every_check(kube: ControlPlane, good: Install, tmp_path: Path) -> None:
    plugin, runs = _token_plugin(tmp_path, kube.admin_token)
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({**_cluster_and_context(kube, "sso"),
                                  "users": [{"name": "sso", "user": _exec_user(plugin)}]}))
    _checks_pass(kube, good, kubeconfig=config)
    assert runs.read_text().count("run") >= 1
    # A token the API server does not accept: exit 2, naming the context, no check run.
    (tmp_path / "token").write_text("not-" + kube.admin_token)
    code, outcomes, out = doctor(kube, kubeconfig=config)
    assert code == 2 and not outcomes, out
    assert "refused the credentials of context e2e" in out, out


def test_a_merged_kubeconfig_pair_context_in_one_file_user_in_the_other(kube: ControlPlane, good: Install,
                                                                        tmp_path: Path) -> None:
    plugin, _ = _token_plugin(tmp_path, kube.admin_token)
    context_file, user_file = tmp_path / "a", tmp_path / "b"
    context_file.write_text(json.dumps(_cluster_and_context(kube, "sso")))
    user_file.write_text(json.dumps({"apiVersion": "v1", "kind": "Config",
                                     "users": [{"name": "sso", "user": _exec_user(plugin)}]}))
    _checks_pass(kube, good, kubeconfig_env=f"{context_file}{os.pathsep}{user_file}")
    # Without the second file the context names a user no file has: said, instead of going out anonymous.
    code, _, out = doctor(kube, kubeconfig_env=str(context_file))
    assert code == 2 and "names user 'sso', which no file" in out, out


# -- ranks served: real sidecars asked through the API server's pod proxy ---------------------------

WORKER_SERVER = """
import sys, time
import torch.distributed  # the worker server only after torch.distributed has finished importing
from torch._C._distributed_c10d import _WorkerServer
server = _WorkerServer(sys.argv[1])
print("serving", flush=True)
time.sleep(600)
"""


def _host_address() -> str:
    """This machine's non-loopback IPv4 address: the API server refuses to proxy to loopback."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
        except OSError:
            pytest.skip("no non-loopback IPv4 address to run a sidecar on")
        address = str(probe.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("no non-loopback IPv4 address to run a sidecar on")
    return address


def _injected_pod(kube: ControlPlane, namespace: str, name: str, address: str, port: int, *,
                  tls: bool = False) -> None:
    """`tls`: the sidecar serves HTTPS, and its probe says so (as the webhook injects it with sidecar.tls)."""
    probe = {"readinessProbe": {"httpGet": {"path": "/readyz", "port": "frscope", "scheme": "HTTPS"}}} if tls else {}
    kube.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"frscope.io/inject": "true", "training.kubeflow.org/job-name": "llm"},
                     "annotations": {"frscope.io/injected": "native-sidecar"}},
        "spec": {"initContainers": [{"name": "frscope-sidecar", "image": "frscope:e2e", "restartPolicy": "Always",
                                     "ports": [{"name": "frscope", "containerPort": port}], **probe}],
                 "containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]}})
    running = {"running": {"startedAt": _now()}}
    kube.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps({
        "status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}], "startTime": _now(),
                   "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _now()}],
                   "initContainerStatuses": [{"name": "frscope-sidecar", "image": "frscope:e2e", "imageID": "",
                                              "ready": True, "restartCount": 0, "started": True, "state": running}],
                   "containerStatuses": [{"name": "pytorch", "image": "registry.invalid/train:1", "imageID": "",
                                          "ready": True, "restartCount": 0, "started": True, "state": running}]}}))


@contextlib.contextmanager
def _sidecar(directory: Path, address: str, *, tls: bool = False) -> Iterator[int]:
    """A real `frscope sidecar` on `address`, serving the rank sockets of `directory`; yields its port. `tls`:
    over HTTPS, with a certificate of a CA like the chart's."""
    port_file = directory / "port"
    tls_args: list[str] = []
    if tls:
        from frscope.operator.evidence.sidecar_tls import SidecarCa
        from frscope.testing.tls import key_and_csr, write_ca

        key, csr = key_and_csr()
        (directory / "tls.key").write_bytes(key)
        (directory / "tls.crt").write_bytes(SidecarCa(write_ca(directory / "ca")).issue(csr, "ns", "pod"))
        tls_args = ["--tls-cert-file", str(directory / "tls.crt"), "--tls-key-file", str(directory / "tls.key")]
    with open(directory / "sidecar.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(directory),
                                 "--evidence-dir", "none", "--host", address, "--port", "0", "--port-file",
                                 str(port_file), "--poll-interval", "1", *tls_args],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            yield int(_wait_for("the sidecar's port", lambda: port_file.exists() and port_file.read_text().strip()))
        finally:
            proc.terminate()
            proc.wait(timeout=15)


def test_a_sidecar_serving_no_rank_fails_ranks_served(kube: ControlPlane, good: Install, training_namespace: str,
                                                      tmp_path: Path) -> None:
    address = _host_address()
    kube.kubectl("label", "namespace", training_namespace, "frscope.io/inject=true")
    served, idle = tmp_path / "served", tmp_path / "idle"
    served.mkdir()
    idle.mkdir()
    rank = subprocess.Popen([sys.executable, "-c", WORKER_SERVER, str(served / "rank-0.sock")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == b"serving"
        # The serving one over HTTPS (the chart's default): doctor asks it through the pod proxy's `https:`.
        with _sidecar(served, address, tls=True) as port_served, _sidecar(idle, address) as port_idle:
            _injected_pod(kube, training_namespace, "llm-master-0", address, port_served, tls=True)
            _injected_pod(kube, training_namespace, "llm-worker-0", address, port_idle)

            def ranks_line() -> str | None:
                code, outcomes, out = doctor(kube, "--namespace", training_namespace, "--job", "llm")
                line = next(x for x in out.splitlines() if "ranks-served:" in x)
                return line if "did not answer" not in line else None  # a sidecar still starting

            line = _wait_for("both sidecars answering", ranks_line, timeout=30)
            assert line.startswith("[FAIL]") and "llm-worker-0" in line and "llm-master-0" not in line, line
            assert "serve no rank" in line
            kube.kubectl("delete", "pod", "llm-worker-0", "-n", training_namespace, "--grace-period=0", "--force")
            code, outcomes, out = doctor(kube, "--namespace", training_namespace, "--job", "llm")
            assert outcomes["ranks-served"] == "ok" and "1 sidecars serve 1 ranks" in out, out
    finally:
        rank.kill()
        rank.wait(timeout=10)
        if rank.stdout is not None:
            rank.stdout.close()
