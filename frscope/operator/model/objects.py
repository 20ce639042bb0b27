"""Typed views of the Kubernetes objects the operator watches (the jobs of `jobkinds` and their pods).

Pure functions over the raw dicts kopf hands over; nothing here talks to the API server.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import sys
from dataclasses import dataclass
from typing import Any

from frscope.operator import names
from frscope.operator.model import jobkinds


@dataclass(frozen=True, slots=True, order=True)
class JobKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class JobRef:
    """Enough of a job to address it, own things with it and post Events about it."""

    namespace: str
    name: str
    uid: str
    api_version: str = f"{names.JOB_GROUP}/{names.JOB_VERSION}"
    kind: str = names.JOB_KIND
    generation: int | None = None  # metadata.generation (a metav1.Condition's observedGeneration)

    @property
    def key(self) -> JobKey:
        return JobKey(self.namespace, self.name)

    @property
    def job_kind(self) -> jobkinds.JobKind:
        return jobkinds.by_kind(self.kind)


@dataclass(frozen=True, slots=True)
class Termination:
    """One ended run of a trainer container, as the kubelet reported it."""

    container: str
    run: int  # 0 for the first run of the container, 1 after one restart, ...
    exit_code: int | None
    reason: str
    message: str
    finished_at_ns: int | None = None  # `finishedAt` (RFC 3339, second precision), ns since the epoch


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    job_name: str
    replica_type: str
    replica_index: int | None
    ip: str | None
    sidecar_port: int | None  # the container port named `frscope`
    phase: str
    run: int  # the trainer's current run (its restartCount)
    terminations: tuple[Termination, ...]
    deleting: bool
    node: str = ""  # spec.nodeName ('' until scheduled)
    gpus: int = 0  # accelerators the pod asks for (GPU_RESOURCES), all containers
    # The trainer's collective timeout as its env states it (WATCHDOG_TIMEOUT_ENV), seconds.
    env_timeout_s: float | None = None
    family: str = jobkinds.FAMILY_KUBEFLOW_V1  # which labels named the job (jobkinds.FAMILY_*)
    world_size_hint: int | None = None  # PET_NNODES x PET_NPROC_PER_NODE in the pod's env, when numbers

    @property
    def endpoint(self) -> str | None:
        """The sidecar's base URL, when the pod has an IP and a port named `frscope`."""
        if not self.ip or not self.sidecar_port:
            return None
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.sidecar_port}"


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def job_ref(job: dict[str, Any]) -> JobRef:
    meta = _meta(job)
    return JobRef(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        api_version=str(job.get("apiVersion") or f"{names.JOB_GROUP}/{names.JOB_VERSION}"),
        kind=str(job.get("kind") or names.JOB_KIND),
        generation=meta.get("generation") if isinstance(meta.get("generation"), int) else None,
    )


def job_conditions(job: dict[str, Any]) -> list[dict[str, Any]]:
    status = job.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return [c for c in conditions if isinstance(c, dict)] if isinstance(conditions, list) else []


def job_world_size(job: dict[str, Any]) -> int | None:
    """The ranks the job's spec says, when it says them as numbers; else None."""
    return jobkinds.world_size(jobkinds.by_kind(str(job.get("kind") or names.JOB_KIND)), job)


def _sidecar_port(spec: dict[str, Any]) -> int | None:
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            if not isinstance(container, dict):
                continue
            for port in container.get("ports") or []:
                if isinstance(port, dict) and port.get("name") == names.SIDECAR_PORT_NAME:
                    value = port.get("containerPort")
                    if isinstance(value, int) and 0 < value < 65536:
                        return value
    return None


# What a pod record keeps of a status anyone with `pods/status` may write (the kubelet's own bounds:
# a termination message is at most 4096 bytes; the watchdog's line is at its end).
MAX_CONTAINERS = 64  # container statuses read of one pod
MAX_MESSAGE = 4096  # characters of a termination message kept: its tail
MAX_SHORT = 256  # characters of a reason, phase or container name


def _short(value: Any, default: str = "") -> str:
    """A short string field, clipped, and shared among pods (`sys.intern`: 32,768 pods say 'Running')."""
    return sys.intern(str(value or default)[:MAX_SHORT])


def _trainer_statuses(status: dict[str, Any]) -> list[dict[str, Any]]:
    raw = status.get("containerStatuses")
    statuses = [s for s in raw[:MAX_CONTAINERS] if isinstance(s, dict)] if isinstance(raw, list) else []
    trainers = [s for s in statuses if s.get("name") in names.TRAINER_CONTAINERS]
    return trainers or [s for s in statuses if s.get("name") != names.SIDECAR_CONTAINER]


def _termination(container: str, run: int, raw: Any) -> Termination | None:
    if not isinstance(raw, dict):
        return None
    terminated = raw.get("terminated")
    if not isinstance(terminated, dict):
        return None
    code = terminated.get("exitCode")
    return Termination(
        container=container,
        run=max(run, 0),
        exit_code=code if isinstance(code, int) else None,
        reason=_short(terminated.get("reason")),
        message=str(terminated.get("message") or "")[-MAX_MESSAGE:],
        finished_at_ns=_rfc3339_ns(terminated.get("finishedAt")),
    )


def _rfc3339_ns(value: Any) -> int | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


# Extended resources that are accelerators a training rank holds: counted as the job's GPUs.
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe", "habana.ai/gaudi")
# Torch reads the collective timeout from code only (init_process_group(timeout=...)); a job that takes it
# from the environment can name it here so that frscope knows it too (docs/actions.md).
WATCHDOG_TIMEOUT_ENV = "FRSCOPE_WATCHDOG_TIMEOUT_SECONDS"


def _quantity(value: Any) -> int:
    try:
        return max(int(str(value)), 0)
    except ValueError:
        return 0


def _pod_gpus(spec: dict[str, Any]) -> int:
    """Accelerators of the pod: its app containers' sum, or the largest init container's (as the scheduler counts)."""
    def count(container: Any) -> int:
        if not isinstance(container, dict):
            return 0
        resources = container.get("resources") if isinstance(container.get("resources"), dict) else {}
        assert isinstance(resources, dict)
        total = 0
        for name in GPU_RESOURCES:
            per = [_quantity((resources.get(kind) or {}).get(name, 0)) for kind in ("limits", "requests")
                   if isinstance(resources.get(kind), dict)]
            total += max(per, default=0)
        return total

    app = sum(count(c) for c in spec.get("containers") or [])
    init = max((count(c) for c in spec.get("initContainers") or []), default=0)
    return max(app, init)


def _env_timeout(spec: dict[str, Any]) -> float | None:
    for container in spec.get("containers") or []:
        if not isinstance(container, dict) or container.get("name") == names.SIDECAR_CONTAINER:
            continue
        for env in container.get("env") or []:
            if isinstance(env, dict) and env.get("name") == WATCHDOG_TIMEOUT_ENV:
                try:
                    value = float(str(env.get("value")))
                except ValueError:
                    return None
                return value if value > 0 else None
    return None


def pod_info(pod: dict[str, Any]) -> PodInfo:
    meta = _meta(pod)
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    assert isinstance(labels, dict)
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    assert isinstance(spec, dict) and isinstance(status, dict)
    owner = jobkinds.pod_job(labels)
    run = 0
    terminations: list[Termination] = []
    for cs in _trainer_statuses(status):
        name = _short(cs.get("name"))
        restarts = cs.get("restartCount")
        restarts = restarts if isinstance(restarts, int) else 0
        run = max(run, restarts)
        current = _termination(name, restarts, cs.get("state"))
        previous = _termination(name, restarts - 1, cs.get("lastState"))
        for term in (current, previous):
            if term is not None:
                terminations.append(term)
    # Only these fields are kept of the pod (the raw object is dropped by the caller): what is read of it
    # is here, and strings many pods share are interned.
    return PodInfo(
        namespace=sys.intern(str(meta.get("namespace") or "default")),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        job_name=sys.intern(owner.job_name if owner else (_owner_job(meta) or "")),
        replica_type=sys.intern(owner.replica_type) if owner else "",
        replica_index=owner.replica_index if owner else None,
        ip=pod_ip[:64] if isinstance(pod_ip := status.get("podIP"), str) and pod_ip else None,
        sidecar_port=_sidecar_port(spec),
        phase=_short(status.get("phase"), "Unknown"),
        run=run,
        terminations=tuple(terminations),
        deleting=bool(meta.get("deletionTimestamp")),
        node=sys.intern(str(spec.get("nodeName") or "")),
        gpus=_pod_gpus(spec),
        env_timeout_s=_env_timeout(spec),
        family=owner.family if owner else jobkinds.FAMILY_KUBEFLOW_V1,
        world_size_hint=jobkinds.pod_world_size(spec.get("containers") or []),
    )


def _owner_job(meta: dict[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("kind") == names.JOB_KIND:
            return str(ref.get("name") or "") or None
    return None


def pods_digest(pods: list[PodInfo] | tuple[PodInfo, ...]) -> str:
    """A short name for one generation of a job's pods (new pods after a restart: a new digest)."""
    joined = ",".join(sorted(p.uid for p in pods))
    return hashlib.sha256(joined.encode()).hexdigest()[:8]


_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


def dns_name(*parts: str, limit: int = 63) -> str:
    """A valid object name (DNS-1123 label) from parts; a hash keeps long names unique."""
    raw = "-".join(parts).lower()
    clean = _DNS_LABEL.sub("-", raw).strip("-") or "x"
    if len(clean) <= limit:
        return clean
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{clean[: limit - 9].rstrip('-')}-{digest}"
