"""A sidecar that answers `/v1/status` with hostile bytes (issue 26) is that pod's failure: the status
sweep goes on and every other pod's answer reaches the controller. The sidecars are real aiohttp
servers (`StandInSidecar`: stand-ins, because a real sidecar never sends these answers); the client,
the sweep and the controller are the operator's own."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from frscope.operator.serve.status_poller import StatusPoller
from frscope.wire import SidecarStatus
from tests.unit.operator.fakes import FakeKube
from tests.unit.operator.test_controller import (  # noqa: F401  (the session fixture is used by name)
    Make,
    make_controller,
    session,
    setup_job,
)


@pytest.mark.parametrize(("mode", "reason"), [
    ("status-overflow", None),  # a 400-digit age: read as no age, the answer kept
    ("status-deep", "nested too deeply"),
    ("status-huge", "larger than"),
])
async def test_one_hostile_status_answer_never_stops_the_sweep(
        fake_kube: FakeKube, kube_client: Any, session: aiohttp.ClientSession, sidecars: Make,
        hang_ranks: dict[int, Any], mode: str, reason: str | None) -> None:
    controller = make_controller(kube_client, session)
    healthy, hostile = await setup_job(fake_kube, controller, sidecars, hang_ranks, modes=("ok", mode))
    healthy.stalled = False
    swept: list[tuple[dict[str, SidecarStatus], dict[str, str]]] = []
    real_on_status = controller.on_status

    def noting(key: Any, answers: dict[str, SidecarStatus], failures: dict[str, str] | None = None) -> None:
        swept.append((answers, dict(failures or {})))
        real_on_status(key, answers, failures)

    controller.on_status = noting  # type: ignore[method-assign]
    poller = StatusPoller(controller, interval_s=60, timeout_s=5, max_rps=10_000, concurrency=4)
    await poller.sweep()
    await controller.idle()
    [(answers, failures)] = swept
    assert answers[healthy.pod].pod == healthy.pod
    if reason is None:
        assert all(s.age_s is None for s in answers[hostile.pod].stalls)
    else:
        assert hostile.pod not in answers and reason in failures[hostile.pod], failures
    assert poller.sweeps == 1
