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

BUSYBOX = "frscope-testenv/busybox:dev"


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


def test_node_is_ready_with_the_release_version(node: Any) -> None:
    got = node.plane.kubectl_json("get", "node", "frscope-node")
    info = got["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.36.3"
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    addresses = {a["type"]: a["address"] for a in got["status"]["addresses"]}
    assert addresses["InternalIP"] == "10.213.0.1"
    images = {n for i in got["status"]["images"] for n in i.get("names", [])}
    assert "docker.io/library/frscope:dev" in images
    assert "docker.io/frscope-test/trainer:dev" in images


def test_pod_with_native_sidecar_runs_resolves_services_and_reaches_the_api(node: Any) -> None:
    ns = "node-basics"
    node.kubectl("create", "namespace", ns)
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
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "restartPolicy": "Always",
                    "command": ["sh", "-c", "echo from-the-sidecar > /shared/hello; exec sleep 3600"],
                    "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": [
                        "sh",
                        "-c",
                        "cat /shared/hello; nslookup kubernetes.default.svc.cluster.local; "
                        "wget -q -O- --no-check-certificate https://kubernetes.default.svc/livez "
                        "|| echo 'wget exit' $?; echo; echo done",
                    ],
                    "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                }
            ],
        },
    }
    node.plane.apply(pod)
    got = _wait_pod_phase(node, ns, "probe", {"Succeeded", "Failed"})
    assert ipaddress.ip_address(got["status"]["podIP"]) in ipaddress.ip_network("10.213.0.0/24")
    logs = node.kubectl("-n", ns, "logs", "probe", "-c", "main").stdout
    assert "from-the-sidecar" in logs
    assert "10.214.0.1" in logs  # CoreDNS answered with the kubernetes Service's ClusterIP
    # The API server answered through the Service (anonymous /livez is allowed: "ok"), via kube-proxy.
    assert "ok" in logs.splitlines(), logs
    assert got["status"]["phase"] == "Succeeded", json.dumps(got["status"], indent=1)
    node.kubectl("delete", "namespace", ns, "--wait=false")


def test_kubectl_exec_reaches_the_container(node: Any) -> None:
    ns = "node-exec"
    node.kubectl("create", "namespace", ns)
    node.kubectl(
        "-n", ns, "run", "sleeper", f"--image={BUSYBOX}", "--image-pull-policy=Never", "--restart=Never",
        "--command", "--", "sleep", "3600",
    )  # fmt: skip
    _wait_pod_phase(node, ns, "sleeper", {"Running"})
    out = node.kubectl("-n", ns, "exec", "sleeper", "--", "cat", "/etc/resolv.conf").stdout
    assert "nameserver 10.213.0.1" in out
    assert f"search {ns}.svc.cluster.local" in out
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
