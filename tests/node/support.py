"""What the node tests share: waiting, helm, the chart's values for the node, job pods and their logs."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "frscope"
RELEASE = "frscope"
SYSTEM_NS = "frscope-system"
CONDITION = "CollectiveTimeoutDiagnosed"
TRAINER = "frscope-test/trainer:dev"
# The frscope image in the node's OCI registry (testenv/registry.py: the node's address, port 5000), pushed
# with the chart's appVersion as its tag, which the chart defaults to: only the repository is set.
REGISTRY_IMAGE = "10.213.0.1:5000/frscope/frscope"
# The chart's values on the node: the image from the registry, pulled by the kubelet on every pod start
# (the operator's and each injected sidecar; never a stale image a previous run left in the node's
# containerd), a short stall threshold so the tests do not wait the default minute, and the sidecars' series
# per rank and group (the journey's stall panel names the waiting ranks; the default, pod, shows pods).
CHART_SETS = [f"image.repository={REGISTRY_IMAGE}", "image.pullPolicy=Always",
              "sidecar.pollIntervalSeconds=2", "sidecar.stallAfterSeconds=10", "sidecar.metricsDetail=rank-group"]


def chart_from_registry(node: Any) -> list[str]:
    """What `helm install|upgrade RELEASE` takes next to install the chart the way a user does: from the
    node's OCI registry (testenv/registry.py), trusting its CA. Pass CHART_SETS with it."""
    registry = node.registry
    assert registry.image_repository == REGISTRY_IMAGE, registry
    return [registry.chart_ref, "--version", registry.chart_version, "--ca-file", str(registry.ca_file)]


# How each pod starts its ranks: torchrun with 2 processes a pod (the journey; the last rank,
# the worker pod's second process, gets stuck), or plain `python`, one rank a pod.
LAUNCHERS = {
    "torchrun": {"nproc": 2, "command": ["torchrun", "/scripts/train.py"]},
    "python": {"nproc": 1, "command": ["python", "/scripts/train.py"]},
}


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 1.0,
             diagnostics: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})\n{diagnostics()}")


def helm(node: Any, home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**node.plane.env(), "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    proc = subprocess.run([str(node.plane.bin_dir / "helm"), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def new_namespace(node: Any, name: str, labels: dict[str, str] | None = None) -> str:
    node.kubectl("create", "namespace", name)
    if labels:
        node.kubectl("label", "namespace", name, *[f"{k}={v}" for k, v in labels.items()])
    # Pods are admitted once the controller manager has made the namespace's default ServiceAccount.
    wait_for(f"the default ServiceAccount of {name}", lambda: node.kubectl(
        "-n", name, "get", "serviceaccount", "default", check=False).returncode == 0, 60)
    return name


def script_configmap(node: Any, namespace: str, name: str, script: str) -> None:
    node.plane.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
                      "data": {"train.py": script}})


def pods(node: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
    return list(node.plane.kubectl_json("-n", namespace, "get", "pods", "-l", selector)["items"])


def container_logs(node: Any, namespace: str, pod: str, container: str, tail: int | None = None) -> str:
    args = ["-n", namespace, "logs", pod, "-c", container]
    if tail is not None:
        args.append(f"--tail={tail}")
    return str(node.kubectl(*args, check=False).stdout)


def dump_state(node: Any, namespace: str, kind: str, name: str, selector: str,
               containers: tuple[str, ...]) -> Callable[[], str]:
    """What a failed wait prints: the job described, its pods, their containers' log tails, the operator's."""
    def dump() -> str:
        parts = [node.kubectl("-n", namespace, "describe", kind, name, check=False).stdout,
                 node.kubectl("-n", namespace, "describe", "pods", check=False).stdout]
        for pod in pods(node, namespace, selector):
            for c in (*containers, "frscope-sidecar"):
                parts.append(f"--- {pod['metadata']['name']}/{c}\n"
                             + container_logs(node, namespace, pod["metadata"]["name"], c, tail=40))
        parts.append(node.kubectl("-n", SYSTEM_NS, "logs", "deploy/frscope", "--tail=60", check=False).stdout)
        return "\n".join(parts)[-20000:]

    return dump


def job_condition(node: Any, namespace: str, kind: str, name: str, type_: str = CONDITION) -> dict[str, Any] | None:
    got = node.plane.kubectl_json("-n", namespace, "get", kind, name)
    return next((c for c in got.get("status", {}).get("conditions") or [] if c["type"] == type_), None)


def reports(node: Any, namespace: str) -> list[dict[str, Any]]:
    """The namespace's incident reports (a job's suspicion report, `job.suspicion`, is not one)."""
    items = node.plane.kubectl_json("-n", namespace, "get", "flightrecorderreports")["items"]
    return [r for r in items if not (r.get("job") or {}).get("suspicion")]


# ---- PyTorchJobs ---------------------------------------------------------------------------------
def pytorchjob(name: str, namespace: str, launcher: str, image: str = TRAINER) -> dict[str, Any]:
    def replica() -> dict[str, Any]:
        return {
            "replicas": 1,
            "restartPolicy": "Never",
            "template": {
                "metadata": {"labels": {"frscope.io/inject": "true"}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "pytorch",
                        "image": image,
                        "imagePullPolicy": "Never",
                        # torchrun takes --nnodes, --node-rank, --nproc-per-node and the rendezvous
                        # endpoint from the PET_* variables the training operator sets; plain python
                        # gets MASTER_ADDR, RANK and WORLD_SIZE from it.
                        "command": LAUNCHERS[launcher]["command"],
                        "volumeMounts": [{"name": "scripts", "mountPath": "/scripts"}],
                    }],
                    "volumes": [{"name": "scripts", "configMap": {"name": f"{name}-script"}}],
                },
            },
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nprocPerNode": str(LAUNCHERS[launcher]["nproc"]),
            "pytorchReplicaSpecs": {"Master": replica(), "Worker": replica()},
        },
    }


def start_job(node: Any, namespace: str, name: str, launcher: str, script: str,
              image: str = TRAINER) -> dict[str, Any]:
    new_namespace(node, namespace)
    script_configmap(node, namespace, f"{name}-script", script)
    return dict(node.plane.apply(pytorchjob(name, namespace, launcher, image)))


def job_pods(node: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    got = node.plane.kubectl_json("-n", namespace, "get", "pods", "-l", f"training.kubeflow.org/job-name={name}")
    return list(got["items"])


def all_running(node: Any, namespace: str, name: str) -> bool:
    pods = job_pods(node, namespace, name)
    return len(pods) == 2 and all(p.get("status", {}).get("phase") == "Running" for p in pods)


def diagnostics(node: Any, namespace: str, name: str) -> Callable[[], str]:
    return dump_state(node, namespace, "pytorchjob", name, f"training.kubeflow.org/job-name={name}", ("pytorch",))
