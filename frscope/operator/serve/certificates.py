"""`POST /v1/certificate`: the sidecars' serving certificates (docs/install.md, "TLS to the sidecars").

A sidecar sends a CSR (PEM) with its pod's projected token for the operator's audience (the token a push
carries). The API server's TokenReview says which pod the token is bound to; the operator reads that pod
and issues a certificate for it only when the pod still has that uid and, with the webhook on, its
sidecar is as injected (`injection.sidecar_as_injected`: the operator polls no other). The certificate
names that pod (`wire.sidecar_tls_name`), whatever the CSR asks for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from frscope.operator.evidence.sidecar_tls import CertificateRefused, SidecarCa
from frscope.operator.injection import InjectionConfig, sidecar_as_injected
from frscope.operator.kube.api_client import KubeClient
from frscope.operator.kube.api_errors import ApiError, KubeError
from frscope.operator.kube.resources import PODS
from frscope.operator.serve.access import PushAuth, Refused

log = logging.getLogger(__name__)

# (namespace, pod, pod uid from the token) -> None when the pod may have a certificate, else why not.
PodCheck = Callable[[str, str, str | None], Awaitable[str | None]]


def pod_check(kube: KubeClient, injection: InjectionConfig | None) -> PodCheck:
    """The pod exists with the token's uid and (with the webhook's settings) its sidecar is as injected."""

    async def check(namespace: str, pod: str, uid: str | None) -> str | None:
        try:
            body = await kube.get(PODS, namespace, pod)
        except ApiError as exc:
            if exc.status == 404:
                return "no such pod"
            raise
        if uid and (body.get("metadata") or {}).get("uid") != uid:
            return "the pod was replaced since the token was issued"
        if injection is not None:
            why = sidecar_as_injected(body, injection)
            if why is not None:
                return f"its sidecar is not as injected ({why})"
        return None

    return check


class CertificateIssuer:
    def __init__(self, ca: SidecarCa, auth: PushAuth, check: PodCheck) -> None:
        self._ca = ca
        self._auth = auth
        self._check = check
        self.issued = 0

    async def handle(self, request: web.Request) -> web.Response:
        try:
            caller = await self._auth.caller(request.headers.get("Authorization", ""), request.remote)
        except Refused as exc:
            log.warning("certificate refused (%d): %s", exc.status, exc.message)
            headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
            return web.json_response({"error": exc.message}, status=exc.status, headers=headers)
        if caller.namespace is None or caller.pod is None:
            return web.json_response({"error": "certificates are issued to a pod proven by its own pod-bound "
                                               "token only (--sidecar-auth kubernetes)"}, status=403)
        try:
            why = await self._check(caller.namespace, caller.pod, caller.pod_uid)
        except KubeError as exc:
            return web.json_response({"error": f"the pod could not be read: {exc}"}, status=503)
        if why is not None:
            log.warning("certificate for %s/%s refused: %s", caller.namespace, caller.pod, why)
            return web.json_response({"error": f"pod {caller.namespace}/{caller.pod}: {why}"}, status=403)
        csr = await request.content.read(64 * 1024 + 1)
        try:
            chain = await asyncio.to_thread(self._ca.issue, csr, caller.namespace, caller.pod)
        except CertificateRefused as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self.issued += 1
        log.info("certificate issued to %s/%s", caller.namespace, caller.pod)
        return web.Response(body=chain, content_type="application/x-pem-file")
