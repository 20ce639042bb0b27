"""Is frscope's bootstrap active in the trainers? Each injected pod's sidecar says on `/readyz` how
many ranks' worker-server sockets it serves (`{"ready": true, "ranks": N}`, no token needed); doctor
asks it through the API server's pod proxy. A sidecar that serves no rank means the trainer never
started torch's worker server: the webhook's PYTHONPATH replaced, no RANK set, or not torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from frscope.doctor.job_checks import injected_pods
from frscope.doctor.result import CheckResult, failed, passed, skipped
from frscope.operator import names
from frscope.operator.kube.api_client import KubeClient
from frscope.operator.kube.api_errors import KubeError


def sidecar_port(pod: Mapping[str, Any]) -> int | None:
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if container.get("name") == names.SIDECAR_CONTAINER:
            for port in container.get("ports") or []:
                if port.get("name") == names.SIDECAR_PORT_NAME and isinstance(port.get("containerPort"), int):
                    return int(port["containerPort"])
    return None


def sidecar_scheme(pod: Mapping[str, Any]) -> str:
    """'https' when the injected sidecar serves TLS (its probes say HTTPS), else 'http'."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if container.get("name") == names.SIDECAR_CONTAINER:
            probe = (container.get("readinessProbe") or {}).get("httpGet") or {}
            return "https" if str(probe.get("scheme", "")).upper() == "HTTPS" else "http"
    return "http"


def ranks_of(answer: Any) -> int | None:
    """The rank count of a /readyz answer; None when it is not one."""
    if isinstance(answer, dict) and answer.get("ready") is True and isinstance(answer.get("ranks"), int):
        return int(answer["ranks"])
    return None


async def _readyz(client: KubeClient, namespace: str, pod: str, port: int, scheme: str = "http") -> int | str:
    # `https:` makes the API server's pod proxy speak TLS to the sidecar (it does not check the certificate).
    target = f"https:{pod}:{port}" if scheme == "https" else f"{pod}:{port}"
    try:
        answer = await client.request("GET", f"/api/v1/namespaces/{namespace}/pods/{target}/proxy/readyz")
    except KubeError as e:
        return f"no answer ({' '.join(str(e).split())[:120]})"
    ranks = ranks_of(answer)
    return ranks if ranks is not None else f"not ready ({str(answer)[:80]})"


async def ranks_served(client: KubeClient, namespace: str, job: str | None) -> CheckResult:
    pods = [p for p in await injected_pods(client, namespace, job)
            if (p.get("status") or {}).get("podIP") and sidecar_port(p) is not None]
    if not pods:
        return skipped("ranks-served", "no running injected pods to ask")
    answers: dict[str, int | str] = {}
    for pod in pods:
        port = sidecar_port(pod)
        assert port is not None
        answers[pod["metadata"]["name"]] = await _readyz(client, namespace, pod["metadata"]["name"], port,
                                                         sidecar_scheme(pod))
    silent = {name: a for name, a in answers.items() if isinstance(a, str)}
    empty = [name for name, a in answers.items() if a == 0]
    if silent:
        listed = ", ".join(f"{name}: {why}" for name, why in sorted(silent.items())[:5])
        return failed("ranks-served", f"{len(silent)} of {len(pods)} sidecars did not answer /readyz: {listed}",
                      f"kubectl -n {namespace} logs POD -c {names.SIDECAR_CONTAINER}")
    if empty:
        return failed("ranks-served", f"{len(empty)} of {len(pods)} sidecars serve no rank (the bootstrap is not "
                      f"active in the trainer): {', '.join(sorted(empty)[:5])}",
                      "keep the PYTHONPATH the webhook sets in the trainer (append to it, do not replace it), "
                      "run torch in the trainer container with RANK set (docs/install.md, 'Opt a job in')")
    total = sum(a for a in answers.values() if isinstance(a, int))
    return passed("ranks-served", f"{len(pods)} sidecars serve {total} ranks")
