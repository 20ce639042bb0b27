"""Tokens the operator shows the sidecars: one per pod, minted with the TokenRequest API.

A token of the operator's service account for the audience `wire.sidecar_audience(namespace, pod)`:
the sidecar of that pod accepts it and no other sidecar does, so a pod that poses as a sidecar (or
captures the traffic of its own) learns nothing that opens another tenant's sidecar. Each token is
cached until 80 % of its life has gone (the kubelet's rule for projected tokens); concurrent asks for
one pod share one request; the cache holds at most `max_pods` pods (the least recently used go).
Needs `create serviceaccounts/token` on the operator's own account only (the chart's Role).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections import OrderedDict

from frscope import wire
from frscope.operator.kube.api_client import KubeClient
from frscope.operator.kube.api_errors import KubeError, TransportError

log = logging.getLogger(__name__)

MIN_LIFETIME_S = 600  # the API server refuses shorter tokens
REFRESH_AT = 0.8  # a token is minted again once this share of its life has gone


def parse_identity(identity: str) -> tuple[str, str]:
    """`system:serviceaccount:NS:NAME` -> (NS, NAME); ValueError for anything else."""
    parts = identity.split(":")
    if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"] or not parts[2] or not parts[3]:
        raise ValueError(f"{identity!r} is not system:serviceaccount:<namespace>:<name>")
    return parts[2], parts[3]


class PodTokens:
    def __init__(self, kube: KubeClient, identity: str, *, lifetime_s: int = 3600, max_pods: int = 65_536) -> None:
        self._kube = kube
        self._namespace, self._account = parse_identity(identity)
        self._lifetime_s = max(MIN_LIFETIME_S, lifetime_s)
        self._max_pods = max_pods
        self._cache: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._pending: dict[tuple[str, str], asyncio.Future[str]] = {}
        self.minted = 0

    def _path(self) -> str:
        return f"/api/v1/namespaces/{self._namespace}/serviceaccounts/{self._account}/token"

    async def token(self, namespace: str, pod: str) -> str:
        """The operator's token for this pod's sidecar; KubeError when the API server refuses one."""
        key = (namespace, pod)
        cached = self._cache.get(key)
        if cached is not None and time.monotonic() < cached[1]:
            self._cache.move_to_end(key)
            return cached[0]
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            token = await self._mint(namespace, pod)
        except BaseException as exc:
            # Those who wait for this pod's token get an error of their own (never this task's cancellation).
            shared = exc if isinstance(exc, Exception) else TransportError(f"TokenRequest for {namespace}/{pod} "
                                                                           "was given up")
            future.set_exception(shared)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        else:
            future.set_result(token)
            return token
        finally:
            del self._pending[key]

    async def _mint(self, namespace: str, pod: str) -> str:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [wire.sidecar_audience(namespace, pod)],
                         "expirationSeconds": self._lifetime_s}}
        started = time.monotonic()
        answer = await self._kube.request("POST", self._path(), body=body)
        status = answer.get("status") if isinstance(answer.get("status"), dict) else {}
        token = status.get("token") if isinstance(status, dict) else None
        if not isinstance(token, str) or not token:
            raise KubeError(f"TokenRequest for {namespace}/{pod}: no token in the answer")
        life = float(self._lifetime_s)
        expires = status.get("expirationTimestamp") if isinstance(status, dict) else None
        if isinstance(expires, str):
            try:
                at = datetime.datetime.fromisoformat(expires.replace("Z", "+00:00"))
                life = max(0.0, min(life, at.timestamp() - time.time()))
            except ValueError:
                pass
        if len(self._cache) >= self._max_pods:
            self._cache.popitem(last=False)
        self._cache[(namespace, pod)] = (token, started + REFRESH_AT * life)
        self.minted += 1
        return token

    def forget(self, namespace: str, pod: str) -> None:
        """Drop a pod's token (the pod is gone, or its sidecar refused the token)."""
        self._cache.pop((namespace, pod), None)
