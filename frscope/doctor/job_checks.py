"""Checks of one namespace or job: opted in, its pods injected, their sidecars up and serving ranks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from frscope.doctor.resources import TRAINJOBS
from frscope.doctor.result import CheckResult, failed, passed, skipped
from frscope.operator import names
from frscope.operator.kube.api_client import KubeClient
from frscope.operator.kube.api_errors import NotFound
from frscope.operator.kube.resources import NAMESPACES, PODS, PYTORCHJOBS

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def _opted_in(labels: Mapping[str, Any] | None) -> bool:
    return (labels or {}).get(names.INJECT_KEY) == "true"


def pytorchjob_templates_opted_in(job: Mapping[str, Any]) -> bool:
    """Every replica type's pod template carries the opt-in label."""
    specs = ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values()
    return bool(specs) and all(_opted_in(((s.get("template") or {}).get("metadata") or {}).get("labels"))
                               for s in specs)


async def opted_in(client: KubeClient, namespace: str, job: str | None) -> CheckResult:
    label = f"{names.INJECT_KEY}=true"
    try:
        ns = await client.get(NAMESPACES, None, namespace)
    except NotFound:
        return failed("opt-in", f"namespace {namespace} does not exist", "check --namespace")
    if _opted_in(ns["metadata"].get("labels")):
        return passed("opt-in", f"namespace {namespace} is labelled {label}")
    if job:
        try:
            body = await client.get(PYTORCHJOBS, namespace, job)
            if pytorchjob_templates_opted_in(body):
                return passed("opt-in", f"PyTorchJob {namespace}/{job}: every pod template is labelled {label}")
        except NotFound:
            pass
    detail = (f"neither namespace {namespace} nor job {job}'s pod templates are labelled {label}" if job
              else f"namespace {namespace} is not labelled {label}")
    return failed("opt-in", detail,
                  f"kubectl label namespace {namespace} {label}  (or label every pod template of the job); "
                  "then recreate the job's pods")


async def _job_pods(client: KubeClient, namespace: str, job: str | None) -> list[dict[str, Any]]:
    if job is None:
        return await client.list(PODS, namespace, label_selector=f"{names.INJECT_KEY}=true")
    pods = await client.list(PODS, namespace, label_selector=f"{names.LABEL_JOB_NAME}={job}")
    if pods:
        return pods
    try:  # a TrainJob's pods are its JobSet's, named after it
        await client.get(TRAINJOBS, namespace, job)
    except NotFound:
        pass
    return await client.list(PODS, namespace, label_selector=f"{JOBSET_NAME_LABEL}={job}")


def _sidecar(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if container.get("name") == names.SIDECAR_CONTAINER:
            found: Mapping[str, Any] = container
            return found
    return None


def not_injected(pods: list[dict[str, Any]]) -> list[str]:
    """Names of pods lacking the injection annotation or the sidecar container."""
    return [p["metadata"]["name"] for p in pods
            if not (p["metadata"].get("annotations") or {}).get(names.ANN_INJECTED) or _sidecar(p) is None]


def sidecar_not_ready(pods: list[dict[str, Any]]) -> list[str]:
    """Names of pods whose sidecar is not ready (its readiness probe is the sidecar's /readyz)."""
    out = []
    for pod in pods:
        status = pod.get("status") or {}
        statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
        mine = [s for s in statuses if s.get("name") == names.SIDECAR_CONTAINER]
        if not mine or not mine[0].get("ready"):
            out.append(pod["metadata"]["name"])
    return out


async def pods_injected(client: KubeClient, namespace: str, job: str | None) -> CheckResult:
    pods = await _job_pods(client, namespace, job)
    what = f"job {job}" if job else f"the opted-in pods of {namespace}"
    if not pods:
        return skipped("injected", f"no pods yet ({what})")
    missing = not_injected(pods)
    if missing:
        return failed("injected", f"{len(missing)} of {len(pods)} pods ({what}) have no sidecar: "
                      + ", ".join(missing[:5]), "fix the opt-in and webhook checks, then recreate those pods "
                      "(the webhook only sees pods as they are created)")
    return passed("injected", f"all {len(pods)} pods ({what}) have the sidecar")


async def injected_pods(client: KubeClient, namespace: str, job: str | None) -> list[dict[str, Any]]:
    """The pods of the job (or the opted-in pods of the namespace) that carry the sidecar."""
    return [p for p in await _job_pods(client, namespace, job) if _sidecar(p) is not None]


async def sidecars_ready(client: KubeClient, namespace: str, job: str | None) -> CheckResult:
    pods = await injected_pods(client, namespace, job)
    if not pods:
        return skipped("sidecars", "no injected pods to check")
    down = sidecar_not_ready(pods)
    if down:
        return failed("sidecars", f"{len(down)} of {len(pods)} sidecars are not ready: " + ", ".join(down[:5]),
                      f"kubectl -n {namespace} logs POD -c {names.SIDECAR_CONTAINER}")
    return passed("sidecars", f"all {len(pods)} sidecars are ready")
