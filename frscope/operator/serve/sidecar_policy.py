"""The sidecars' NetworkPolicy in the namespaces of opted-in pods that have NetworkPolicies of their own
(docs/install.md, "NetworkPolicy"), when the chart is asked to (`networkPolicy.sidecars.addToNamespacesWithPolicies`)
and names no training namespace: a NetworkPolicy is namespaced, so the chart cannot render one for namespaces it
does not know.

The policy only allows: the sidecar port, from the operator and Prometheus. It is added only where the
namespace already has policies of its own (a default-deny one, say), where it opens exactly that port to
exactly those peers. A namespace with none is left open as it is: selecting its training pods would isolate
them and cut the traffic between their ranks; it is looked at again on a later pod event.

The chart renders the policy once (`FRSCOPE_SIDECAR_NETWORK_POLICY`: its name, labels and spec, and the
ClusterRole that grants this, named as its owner) and the operator creates it, the same, in each namespace
the first time it sees an opted-in pod there (and brings an existing one up to date, once per namespace and
process). The owner reference to that cluster-scoped ClusterRole lets Kubernetes' garbage collector remove
every such policy when the release is uninstalled.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from typing import Any

from frscope.operator.kube.api_client import KubeClient
from frscope.operator.kube.api_errors import Conflict, KubeError
from frscope.operator.kube.resources import CLUSTER_ROLES, NETWORK_POLICIES

log = logging.getLogger(__name__)

RETRY_AFTER_S = 60.0  # a namespace left alone or not written is looked at again on a pod event after this


class SidecarPolicies:
    def __init__(self, kube: KubeClient, template: dict[str, Any]) -> None:
        self._kube = kube
        policy = template.get("policy")
        if not isinstance(policy, dict) or not isinstance(policy.get("spec"), dict) \
                or not (policy.get("metadata") or {}).get("name"):
            raise ValueError("FRSCOPE_SIDECAR_NETWORK_POLICY: a policy with metadata.name and a spec is needed")
        self._policy = policy
        owner = template.get("owner")
        self._owner_name = str(owner.get("name")) if isinstance(owner, dict) and owner.get("name") else None
        self._owner_ref: dict[str, Any] | None = None
        self._done: set[str] = set()
        self._failed_at: dict[str, float] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.written = 0
        self.skipped_open = 0

    @classmethod
    def from_env(cls, kube: KubeClient, text: str | None) -> SidecarPolicies | None:
        return cls(kube, json.loads(text)) if text else None

    @property
    def name(self) -> str:
        return str(self._policy["metadata"]["name"])

    def saw_pod(self, pod: dict[str, Any]) -> None:
        """An opted-in pod event: make sure its namespace has the policy (in the background)."""
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        if not namespace or namespace in self._done or namespace in self._tasks:
            return
        if time.monotonic() - self._failed_at.get(namespace, -RETRY_AFTER_S) < RETRY_AFTER_S:
            return
        task = asyncio.create_task(self.ensure(namespace), name=f"frscope-policy-{namespace}")
        self._tasks[namespace] = task
        task.add_done_callback(lambda _t: self._tasks.pop(namespace, None))

    async def _owner(self) -> dict[str, Any] | None:
        if self._owner_ref is None and self._owner_name:
            try:
                role = await self._kube.get(CLUSTER_ROLES, None, self._owner_name)
            except KubeError as exc:
                log.warning("NetworkPolicy owner ClusterRole %s not read (%s): policies are written without it, "
                            "and stay after an uninstall", self._owner_name, exc)
                return None
            self._owner_ref = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                               "name": self._owner_name, "uid": role["metadata"]["uid"]}
        return self._owner_ref

    async def _has_own_policies(self, namespace: str) -> bool:
        """Whether a NetworkPolicy other than frscope's own is in the namespace."""
        policies = await self._kube.list(NETWORK_POLICIES, namespace)
        return any((p.get("metadata") or {}).get("name") != self.name for p in policies)

    async def ensure(self, namespace: str) -> None:
        try:
            own = await self._has_own_policies(namespace)
        except KubeError as exc:
            self._failed_at[namespace] = time.monotonic()
            log.warning("NetworkPolicies of namespace %s not listed (%s); tried again on a later pod event",
                        namespace, exc)
            return
        if not own:
            self._failed_at[namespace] = time.monotonic()
            self.skipped_open += 1
            log.info("namespace %s has no NetworkPolicy of its own: left open (a policy would isolate its training "
                     "pods); looked at again on a later pod event", namespace)
            return
        body = copy.deepcopy(self._policy)
        body.update(apiVersion="networking.k8s.io/v1", kind="NetworkPolicy")
        meta = body.setdefault("metadata", {})
        meta["namespace"] = namespace
        owner = await self._owner()
        if owner is not None:
            meta["ownerReferences"] = [owner]
        try:
            try:
                await self._kube.create(NETWORK_POLICIES, namespace, body)
                log.info("NetworkPolicy %s/%s created: the sidecar port is open to the operator (and "
                         "Prometheus), next to the namespace's own policies", namespace, self.name)
            except Conflict:  # there already: bring it up to date (a chart upgrade may have changed it)
                patch = {"metadata": {k: v for k, v in meta.items() if k in ("labels", "ownerReferences")},
                         "spec": body["spec"]}
                await self._kube.merge_patch(NETWORK_POLICIES, namespace, self.name, patch)
        except KubeError as exc:
            self._failed_at[namespace] = time.monotonic()
            log.warning("NetworkPolicy %s/%s not written (%s); tried again on a later pod event", namespace,
                        self.name, exc)
            return
        self._done.add(namespace)
        self.written += 1

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
