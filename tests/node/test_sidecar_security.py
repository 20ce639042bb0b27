"""The injected sidecar runs as its own non-root user whatever the pod says (issue 34), on the real node with the
chart installed (its webhook injects): a pod running as root (`runAsUser: 0`, `runAsNonRoot: false`) and a pod
of a namespace that enforces the `restricted` Pod Security level both start with the sidecar; the sidecar runs
as 65532:65532 in both, and shares the pod's volume with the trainer's user (root, or 1000 with umask 077)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.node.support import new_namespace, wait_for

pytestmark = [pytest.mark.node, pytest.mark.timeout(600)]

# Debian's python3 + a shell (testenv/build-images), as the trainer container.
IMAGE = "frscope-testenv/init:dev"
SIDECAR = "frscope-sidecar"
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _pod(name: str, namespace: str, pod_security: dict[str, Any], container_security: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"frscope.io/inject": "true", "training.kubeflow.org/job-name": name}},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "securityContext": pod_security,
            "containers": [{"name": "pytorch", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "umask 077; exec sleep 3600"],
                            "securityContext": container_security}],
        },
    }


def _running_with_the_sidecar(node: Any, namespace: str, name: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod: dict[str, Any] = node.plane.kubectl_json("-n", namespace, "get", "pod", name)
        status = pod.get("status") or {}
        started = [s for s in status.get("initContainerStatuses") or [] if s["name"] == SIDECAR and s.get("started")]
        return pod if status.get("phase") == "Running" and started else None

    def described() -> str:
        return str(node.kubectl("-n", namespace, "describe", "pod", name, check=False).stdout)

    pod: dict[str, Any] = wait_for(f"pod {namespace}/{name} running with its sidecar", running, 240, 2,
                                   diagnostics=described)
    return pod


def _exec(node: Any, namespace: str, pod: str, container: str, *cmd: str) -> str:
    return str(node.kubectl("-n", namespace, "exec", pod, "-c", container, "--", *cmd).stdout).strip()


def _ids(node: Any, namespace: str, pod: str, container: str) -> str:
    """uid:gid of the container's first process, read by the container itself."""
    return _exec(node, namespace, pod, container, "python3" if container != SIDECAR else "python", "-c",
                 "import os; print(f'{os.getuid()}:{os.getgid()}')")


def test_a_root_pod_and_a_restricted_pod_both_start_with_the_non_root_sidecar(node: Any, installed: Path) -> None:
    stamp = time.strftime("%H%M%S")
    loose = new_namespace(node, f"sec-root-{stamp}")
    strict = new_namespace(node, f"sec-restricted-{stamp}", {"pod-security.kubernetes.io/enforce": "restricted"})
    try:
        node.plane.apply(_pod("root", loose, {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}, {}))
        restricted_pod = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                          "seccompProfile": {"type": "RuntimeDefault"}}
        node.plane.apply(_pod("restricted", strict, restricted_pod, RESTRICTED_CONTAINER))
        for namespace, name, trainer_ids in ((loose, "root", "0:0"), (strict, "restricted", "1000:1000")):
            pod = _running_with_the_sidecar(node, namespace, name)
            [sidecar] = [c for c in pod["spec"]["initContainers"] if c["name"] == SIDECAR]  # injected, native
            assert sidecar["securityContext"]["runAsUser"] == 65532, sidecar["securityContext"]
            assert _ids(node, namespace, name, SIDECAR) == "65532:65532"  # never the pod's root
            assert _ids(node, namespace, name, "pytorch") == trainer_ids  # the trainer keeps the pod's user
            # The shared volume works across the two users: the sidecar's bootstrap is readable by the trainer,
            # the dump directory writable by it (1777), whatever the trainer's umask (077).
            assert _exec(node, namespace, name, "pytorch", "sh", "-c",
                         "test -r /run/frscope/python/sitecustomize.py && echo readable") == "readable"
            assert _exec(node, namespace, name, "pytorch", "stat", "-c", "%a", "/run/frscope/dumps") == "1777"
            _exec(node, namespace, name, "pytorch", "sh", "-c", "umask 077; echo x > /run/frscope/dumps/probe")
    finally:
        for namespace in (loose, strict):
            node.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
