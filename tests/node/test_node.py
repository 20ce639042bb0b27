"""The node is real: the kubelet runs pods in containerd, pods get addresses on the node's bridge,
resolve Services through CoreDNS, reach the API server through the `kubernetes` Service, a native
sidecar shares an emptyDir with the main container, `kubectl logs` and `exec` work through the
kubelet, and the Kubeflow training operator runs the way its own manifests deploy it."""

from __future__ import annotations

import ipaddress
import json
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.node, pytest.mark.timeout(300)]

# Debian's python3 + a shell (the training operator's init-container image, built by testenv/build-images).
IMAGE = "frscope-testenv/init:dev"
# From inside a pod: the kubernetes Service's name resolves (CoreDNS) and its ClusterIP accepts a TLS
# connection from the API server (kube-proxy's rules), verified with the pod's service-account CA.
PROBE_PY = """
import socket, ssl
print("resolved", socket.gethostbyname("kubernetes.default.svc"))
ctx = ssl.create_default_context(cafile="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
with socket.create_connection(("kubernetes.default.svc", 443), timeout=10) as raw:
    with ctx.wrap_socket(raw, server_hostname="kubernetes.default.svc") as tls:
        print("tls to the API server", tls.version())
"""


def _wait_pod_phase(node: Any, namespace: str, name: str, phases: set[str], timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    pod: dict[str, Any] = {}
    while time.monotonic() < deadline:
        pod = node.plane.kubectl_json("-n", namespace, "get", "pod", name)
        if pod.get("status", {}).get("phase") in phases:
            return pod
        time.sleep(1)
    described = node.kubectl("-n", namespace, "describe", "pod", name, check=False).stdout
    raise AssertionError(f"pod {name} not in {phases} after {timeout}s:\n{described}")


def _namespace(node: Any, name: str) -> str:
    node.kubectl("create", "namespace", name)
    # Pods are admitted once the controller manager has made the namespace's default ServiceAccount.
    deadline = time.monotonic() + 60
    while node.kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode != 0:
        assert time.monotonic() < deadline, f"no default ServiceAccount in {name}"
        time.sleep(0.5)
    return name


def test_node_is_ready_with_the_release_version(node: Any) -> None:
    got = node.plane.kubectl_json("get", "node", "frscope-node")
    info = got["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.36.3"
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    addresses = {a["type"]: a["address"] for a in got["status"]["addresses"]}
    assert addresses["InternalIP"] == "10.213.0.1"
    images = {n for i in got["status"]["images"] for n in i.get("names") or []}
    assert "docker.io/frscope-test/trainer:dev" in images


def test_the_kubelet_pulls_frscope_from_the_registry_over_tls_the_node_trusts(node: Any) -> None:
    """The OCI registry (testenv/registry.py) holds what a release publishes, the image and the chart, and
    the kubelet pulls the image from it through containerd's hosts.toml (the registry's CA), on every
    start of a pod whose pull policy is Always."""
    registry = node.registry
    _, catalog = registry.get("/v2/_catalog")
    assert {"frscope/frscope", "charts/frscope"} <= set(catalog["repositories"]), catalog
    tag = registry.image.rsplit(":", 1)[1]
    headers, _ = registry.get(f"/v2/frscope/frscope/manifests/{tag}",
                              accept="application/vnd.oci.image.manifest.v1+json")
    assert headers["Docker-Content-Digest"] == registry.image_digest
    _, chart = registry.get(f"/v2/charts/frscope/manifests/{registry.chart_version}",
                            accept="application/vnd.oci.image.manifest.v1+json")
    assert chart["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    [layer] = chart["layers"]
    assert layer["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip"

    ns = _namespace(node, "node-registry")
    node.plane.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pulled", "namespace": ns},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "frscope", "image": registry.image, "imagePullPolicy": "Always", "args": ["--version"]}]},
    })
    pod = _wait_pod_phase(node, ns, "pulled", {"Succeeded", "Failed"})
    [status] = pod["status"]["containerStatuses"]
    assert pod["status"]["phase"] == "Succeeded", status
    assert status["imageID"] == f"{registry.image_repository}@{registry.image_digest}", status
    assert "frscope" in node.kubectl("-n", ns, "logs", "pulled").stdout
    events = node.kubectl("-n", ns, "get", "events", "--field-selector", "involvedObject.name=pulled").stdout
    assert f'Successfully pulled image "{registry.image}"' in events, events
    node.kubectl("delete", "namespace", ns, "--wait=false")


def test_pod_with_native_sidecar_runs_resolves_services_and_reaches_the_api(node: Any) -> None:
    ns = _namespace(node, "node-basics")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "initContainers": [
                {
                    "name": "sidecar",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "restartPolicy": "Always",
                    "command": ["sh", "-c", "echo from-the-sidecar > /shared/hello; exec sleep 3600"],
                    "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", 'cat /shared/hello && exec python3 -c "$PROBE"'],
                    "env": [{"name": "PROBE", "value": PROBE_PY}],
                    "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                }
            ],
        },
    }
    node.plane.apply(pod)
    got = _wait_pod_phase(node, ns, "probe", {"Succeeded", "Failed"})
    assert ipaddress.ip_address(got["status"]["podIP"]) in ipaddress.ip_network("10.213.0.0/24")
    logs = node.kubectl("-n", ns, "logs", "probe", "-c", "main").stdout
    assert "from-the-sidecar" in logs, logs
    assert "resolved 10.214.0.1" in logs, logs  # CoreDNS answered with the kubernetes Service's ClusterIP
    assert "tls to the API server TLSv1.3" in logs, logs
    assert got["status"]["phase"] == "Succeeded", json.dumps(got["status"], indent=1)
    node.kubectl("delete", "namespace", ns, "--wait=false")


def test_kubectl_exec_reaches_the_container(node: Any) -> None:
    ns = _namespace(node, "node-exec")
    node.kubectl(
        "-n", ns, "run", "sleeper", f"--image={IMAGE}", "--image-pull-policy=Never", "--restart=Never",
        "--command", "--", "sleep", "3600",
    )  # fmt: skip
    _wait_pod_phase(node, ns, "sleeper", {"Running"})
    out = node.kubectl("-n", ns, "exec", "sleeper", "--", "cat", "/etc/resolv.conf").stdout
    assert "nameserver 10.213.0.1" in out
    assert f"search {ns}.svc.cluster.local" in out
    # The training operator's init-container check: a short Service name through the search path.
    out = node.kubectl("-n", ns, "exec", "sleeper", "--", "nslookup", "kubernetes.default").stdout
    assert out.startswith("10.214.0.1 "), out
    node.kubectl("delete", "namespace", ns, "--wait=false")


def test_training_operator_runs_from_its_own_manifests(node: Any) -> None:
    deploy = node.plane.kubectl_json("-n", "kubeflow", "get", "deployment", "training-operator")
    assert deploy["status"].get("availableReplicas") == 1
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "docker.io/frscope-testenv/training-operator:v1.8.1"
    # Its own webhook certificate, made and injected by itself.
    webhook = node.plane.kubectl_json(
        "get", "validatingwebhookconfiguration", "validator.training-operator.kubeflow.org"
    )
    assert all(w["clientConfig"].get("caBundle") for w in webhook["webhooks"])
