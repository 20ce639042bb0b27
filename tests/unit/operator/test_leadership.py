"""Two replicas' `run_elected` (serve.leadership) in one event loop over the fake API server: the standby
serves its probes and turns every other request away (503, Retry-After, a new connection), the leader's
pod is labelled for the Service once its operator is ready and any stale leader label goes, a clean stop
hands the Lease over at once, and a leader that loses the Lease stops its operator and exits 1.
Real processes and the real API server: tests/e2e/test_failover_e2e.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp

from frscope.operator import names
from frscope.operator.engine.settings import LeaderElection
from frscope.operator.kube import KubeClient
from frscope.operator.serve.leadership import run_elected
from tests.unit.operator.fakes import FakeKube

FAST = {"duration_s": 1.5, "renew_deadline_s": 1.0, "retry_period_s": 0.1}


def role(fake_kube: FakeKube, pod: str) -> str | None:
    obj = fake_kube.get("pods", "ops", pod)
    assert obj is not None
    return (obj["metadata"].get("labels") or {}).get(names.LABEL_OPERATOR_ROLE)


class Replica:
    """One replica: its election, a stand-in for the operator (`lead`) that serves until stopped."""

    def __init__(self, kube_client: KubeClient, name: str, port: int) -> None:
        self.name, self.port = name, port
        self.stop = asyncio.Event()
        self.leading = asyncio.Event()
        self.election = LeaderElection("frscope", "ops", f"{name}_1", name, **FAST)
        self.task = asyncio.create_task(run_elected(self.election, kube_client, host="127.0.0.1", port=port,
                                                    stop=self.stop, lead=self._lead))

    async def _lead(self, on_ready: Callable[[], Awaitable[None]]) -> None:
        await on_ready()
        self.leading.set()
        await self.stop.wait()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_standby_answers_probes_only_then_takes_over_when_the_leader_stops(
        fake_kube: FakeKube, kube_client: KubeClient) -> None:
    for pod in ("op-a", "op-b", "op-old"):
        fake_kube.put("pods", {"metadata": {"name": pod, "namespace": "ops", "labels": {"app": "frscope"}}})
    # a pod whose process died holding the Lease long ago keeps its label until the new leader removes it
    fake_kube.put("pods", {"metadata": {"name": "op-old", "namespace": "ops",
                                        "labels": {names.LABEL_OPERATOR_ROLE: "leader"}}})
    a = Replica(kube_client, "op-a", free_port())
    await asyncio.wait_for(a.leading.wait(), 10)
    b = Replica(kube_client, "op-b", free_port())
    async with aiohttp.ClientSession() as http:
        async def standby_up() -> None:
            while True:
                try:
                    async with http.get(f"http://127.0.0.1:{b.port}/readyz") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)

        await asyncio.wait_for(standby_up(), 10)
        async with http.get(f"http://127.0.0.1:{b.port}/readyz") as resp:
            assert (await resp.json())["leader"] is False  # ready: a healthy standby counts for the budget
        async with http.post(f"http://127.0.0.1:{b.port}/v1/push", data=b"{}") as resp:
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
            assert resp.headers["Connection"] == "close"
            assert "op-a_1" in (await resp.json())["error"]
    assert (role(fake_kube, "op-a"), role(fake_kube, "op-b"), role(fake_kube, "op-old")) == (
        "leader", "standby", "standby")
    assert not b.leading.is_set()

    a.stop.set()  # SIGTERM: the operator stops, then the Lease is released
    assert await asyncio.wait_for(a.task, 10) == 0
    await asyncio.wait_for(b.leading.wait(), 2)  # at b's next try, not after the lease duration
    assert role(fake_kube, "op-b") == "leader" and role(fake_kube, "op-a") == "standby"
    b.stop.set()
    assert await asyncio.wait_for(b.task, 10) == 0


async def test_a_leader_that_loses_the_lease_stops_its_operator_and_exits_1(
        fake_kube: FakeKube, kube_client: KubeClient) -> None:
    fake_kube.put("pods", {"metadata": {"name": "op-a", "namespace": "ops"}})
    a = Replica(kube_client, "op-a", free_port())
    await asyncio.wait_for(a.leading.wait(), 10)
    obj = fake_kube.get("leases", "ops", "frscope")
    assert obj is not None
    fake_kube.put("leases", {**obj, "spec": {**obj["spec"], "holderIdentity": "someone-else"}})
    assert await asyncio.wait_for(a.task, 10) == 1
    assert a.stop.is_set()  # its operator was asked to stop
