"""A pod that poses as an injected sidecar (issue 26) is never polled, so never shown a credential.

The attack: a pod opts in (label), sets the `frscope.io/injected` annotation itself and names a port of
its own container `frscope`. Before, the webhook skipped it (the annotation said "done") and the
operator polled that port with the token every sidecar accepted. Now the webhook injects the real
sidecar anyway, the operator trusts a `frscope` port only on a sidecar as injected
(`injection.sidecar_as_injected`), and the status sweep never calls the fake one. The sidecars are real
aiohttp servers (stand-ins: the fake one counts the requests it gets)."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp

from frscope.operator import names
from frscope.operator.engine.settings import OperatorConfig, WebhookConfig
from frscope.operator.injection import InjectionConfig, inject, sidecar_as_injected
from frscope.operator.serve.status_poller import StatusPoller
from tests.unit.operator import builders
from tests.unit.operator.fakes import FakeKube
from tests.unit.operator.test_controller import (  # noqa: F401  (the session fixture is used by name)
    CONFIG,
    Make,
    make_controller,
    session,
)

INJECTION = InjectionConfig(image="registry.example/frscope:1.2", port=9402,
                            operator_identity="system:serviceaccount:frscope:frscope")
WITH_WEBHOOK = OperatorConfig(**{f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__
                                 if f != "webhook"}, webhook=WebhookConfig(injection=INJECTION))


def posing_pod(port: int) -> dict[str, Any]:
    """Opted in, the annotation set by the pod itself, and its own container's port named frscope."""
    body = builders.pod("train-worker-1", index=1, port=None)
    del body["spec"]["initContainers"]
    body["metadata"]["annotations"] = {names.ANN_INJECTED: "native-sidecar"}
    body["spec"]["containers"][0]["ports"] = [{"name": names.SIDECAR_PORT_NAME, "containerPort": port}]
    return body


def injected_pod(port: int) -> dict[str, Any]:
    body = builders.pod("train-worker-0", port=None)
    del body["spec"]["initContainers"]
    out = inject(body, InjectionConfig(image=INJECTION.image, port=port, operator_identity=INJECTION.operator_identity))
    assert out is not None
    out["status"] = body["status"]
    return out


def test_the_webhook_does_not_take_the_pods_word_for_it() -> None:
    body = posing_pod(9402)
    mutated = inject(copy.deepcopy(body), INJECTION)
    assert mutated is not None  # injected all the same (before: None, the annotation was trusted)
    assert sidecar_as_injected(mutated, INJECTION) == "container 'pytorch' declares the frscope port"
    assert sidecar_as_injected(body, INJECTION) == "no container named frscope"
    assert sidecar_as_injected(injected_pod(9402), INJECTION) is None
    defaulted = injected_pod(9402)  # as the API server stores it: its ServiceAccount mount in every container
    defaulted["spec"]["initContainers"][0]["volumeMounts"].append(
        {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True})
    assert sidecar_as_injected(defaulted, INJECTION) is None
    # The image's repository counts, not its tag (pods injected before an upgrade keep theirs).
    assert sidecar_as_injected(injected_pod(9402), InjectionConfig(image="registry.example/frscope:1.3")) is None
    for change, why in ((("image", "evil.example/frscope:1.2"), "image"), (("command", ["sh"]), "command"),
                        (("env", [{"name": "PYTHONPATH", "value": "/x"}]), "environment")):
        tampered = injected_pod(9402)
        tampered["spec"]["initContainers"][0][change[0]] = change[1]
        assert why in (sidecar_as_injected(tampered, INJECTION) or "")


async def test_the_status_sweep_never_calls_a_sidecar_that_is_not_as_injected(
        fake_kube: FakeKube, kube_client: Any, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any]) -> None:
    controller = make_controller(kube_client, session, WITH_WEBHOOK)
    await controller.on_job(None, fake_kube.put("pytorchjobs", builders.job(workers=1, nproc=2)))
    real = await sidecars("train-worker-0", {r: v for r, v in hang_ranks.items() if r < 2}, stalled=False)
    fake = await sidecars("train-worker-1", {r: v for r, v in hang_ranks.items() if r >= 2}, stalled=False)
    await controller.on_pod("ADDED", injected_pod(real.port))
    await controller.on_pod("ADDED", posing_pod(fake.port))
    await StatusPoller(controller, interval_s=60, timeout_s=2, max_rps=1000, concurrency=4).sweep()
    await controller.idle()
    assert real.status_requests == 1 and fake.status_requests == 0
