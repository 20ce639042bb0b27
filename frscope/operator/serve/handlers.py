"""kopf handlers: a few lines each, over the Controller. Registered on an explicit registry.

Only event handlers on the enabled job kinds (jobkinds: PyTorchJob, TrainJob, JobSet), their pods and
frscope's reports (no finalizers, daemons, timers or on.create/update handlers, so kopf never patches
these objects), a login handler, and the mutating webhook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import kopf

from frscope.operator import names
from frscope.operator.engine.controller import Controller
from frscope.operator.injection import NAMESPACE_WEBHOOK_ID, WEBHOOK_ID, InjectionConfig, mutate
from frscope.operator.ledger import NodeLedger
from frscope.operator.model import jobkinds


def register_watchers(registry: kopf.OperatorRegistry, controller: Controller,
                      relogin: Callable[[], kopf.ConnectionInfo],
                      kinds: tuple[jobkinds.JobKind, ...] = (jobkinds.PYTORCHJOB,),
                      ledger: NodeLedger | None = None,
                      on_pod: Callable[[dict[str, Any]], None] | None = None) -> None:
    """`on_pod`: also told of every job pod event's object (the sidecars' NetworkPolicy per namespace)."""
    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return relogin()

    for kind in kinds:
        res = kind.resource

        @kopf.on.event(res.group, res.version, res.plural, id=f"{kind.key}_event", registry=registry)
        async def job_event(event: kopf.RawEvent, **_: Any) -> None:
            await controller.on_job(event.get("type"), dict(event["object"]))

    # frscope's own reports are its ledger: which incidents are diagnosed, which condition to keep.
    @kopf.on.event(names.REPORT_GROUP, names.REPORT_VERSION, names.REPORT_PLURAL, registry=registry)
    async def report_event(event: kopf.RawEvent, **_: Any) -> None:
        await controller.on_report(event.get("type"), dict(event["object"]))
        if ledger is not None:  # the node ledger records each report's incident on its nodes, once
            await ledger.on_report(event.get("type"), dict(event["object"]))

    # One pod watch per label family of the enabled kinds (TrainJob and JobSet pods share JobSet's).
    pod_labels = {jobkinds.FAMILY_KUBEFLOW_V1: jobkinds.LABEL_PYTORCHJOB_NAME,
                  jobkinds.FAMILY_JOBSET: jobkinds.LABEL_JOBSET_NAME}
    for family in sorted({k.family for k in kinds}):

        @kopf.on.event("v1", "pods", id=f"pod_event_{family}", labels={pod_labels[family]: kopf.PRESENT},
                       registry=registry)
        async def pod_event(event: kopf.RawEvent, **_: Any) -> None:
            if on_pod is not None and event.get("type") != "DELETED":
                on_pod(dict(event["object"]))
            await controller.on_pod(event.get("type"), dict(event["object"]))


def register_webhook(registry: kopf.OperatorRegistry, injection: InjectionConfig, *, by_namespace: bool = True) -> None:
    """The pod-label webhook, and (`by_namespace`) the namespace one. Only a configuration whose
    namespaceSelector picks the opted-in namespaces may call the latter: the chart's. A kopf-managed
    configuration (--webhook-managed) has no such selector, so it gets the pod-label webhook only."""
    @kopf.on.mutate("v1", "pods", id=WEBHOOK_ID, operations=["CREATE"], ignore_failures=True,
                    side_effects=False, registry=registry)
    def inject_sidecar(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        injected = mutate(dict(body), injection)
        if injected is not None:
            patch.fns.append(lambda raw: _replace(raw, injected))

    if not by_namespace:
        return

    # Pods of an opted-in namespace (the webhook configuration's namespaceSelector chose them).
    @kopf.on.mutate("v1", "pods", id=NAMESPACE_WEBHOOK_ID, operations=["CREATE"], ignore_failures=True,
                    side_effects=False, registry=registry)
    def inject_sidecar_by_namespace(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        injected = mutate(dict(body), injection, namespace_opted_in=True)
        if injected is not None:
            patch.fns.append(lambda raw: _replace(raw, injected))


def _replace(raw: kopf.RawBody, new: dict[str, Any]) -> None:
    target = cast(dict[str, Any], raw)
    target.clear()
    target.update(new)
