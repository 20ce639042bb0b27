"""Kubernetes-shaped dicts for the operator tests: a PyTorchJob and its pods, as the training
operator and the kubelet would write them."""

from __future__ import annotations

from typing import Any

from frscope.operator import names


def job(name: str = "train", namespace: str = "ml", uid: str = "job-uid-1", *, workers: int = 1, nproc: Any = 2,
        conditions: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "pytorch", "image": "trainer:1"}]}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations or {}},
        "spec": {
            "nprocPerNode": nproc,
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template},
                "Worker": {"replicas": workers, "template": template},
            },
        },
        "status": {"conditions": conditions if conditions is not None else [
            {"type": "Created", "status": "True", "reason": "PyTorchJobCreated"},
            {"type": "Running", "status": "True", "reason": "PyTorchJobRunning"},
        ]},
    }


def pod(name: str, *, job_name: str = "train", namespace: str = "ml", uid: str | None = None,
        replica_type: str = "Worker", index: int = 0, ip: str | None = "127.0.0.1", port: int | None = 9402,
        restarts: int = 0, state: dict[str, Any] | None = None, last_state: dict[str, Any] | None = None,
        native: bool = True, phase: str = "Running") -> dict[str, Any]:
    sidecar = {"name": names.SIDECAR_CONTAINER, "image": "frscope:1",
               "ports": [{"name": names.SIDECAR_PORT_NAME, "containerPort": port}] if port else []}
    spec: dict[str, Any] = {"containers": [{"name": "pytorch", "image": "trainer:1"}]}
    if native:
        spec["initContainers"] = [dict(sidecar, restartPolicy="Always")]
    else:
        spec["containers"].append(sidecar)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
            "labels": {names.INJECT_KEY: "true", names.LABEL_JOB_NAME: job_name,
                       names.LABEL_REPLICA_TYPE: replica_type.lower(),
                       names.LABEL_REPLICA_INDEX: str(index)},
            "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job_name,
                                 "uid": "job-uid-1", "controller": True}],
        },
        "spec": spec,
        "status": {
            "phase": phase,
            "podIP": ip,
            "containerStatuses": [{"name": "pytorch", "restartCount": restarts, "ready": True,
                                   "state": state or {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                                   "lastState": last_state or {}}],
        },
    }


WATCHDOG_MESSAGE = (
    "[rank1]:[E1202 16:00:00.000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=8, "
    "NumelOut=8, Timeout(ms)=600000) ran for 600013 milliseconds before timing out."
)


def terminated(message: str, code: int = 134) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": "Error", "message": message}}
