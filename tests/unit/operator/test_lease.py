"""Leader election over a Lease (kube.lease) against the fake API server's conditional writes, with a
clock the test moves: one holder at a time, a standby takes over only after the record stood still for
the lease duration on its own clock, a released Lease at once, and a leader that cannot renew gives up
before a standby may take over. The real API server and real processes: tests/e2e/test_failover_e2e.py."""

from __future__ import annotations

import asyncio

import pytest

from frscope.operator.kube import KubeClient
from frscope.operator.kube.lease import ElectionOptions, LeaderElector, LeadershipLost
from tests.unit.operator.fakes import FakeKube


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(kube_client: KubeClient, identity: str, clock: Clock, **timing: float) -> LeaderElector:
    options = ElectionOptions("frscope", "ops", identity, **timing)
    return LeaderElector(kube_client, options, clock=clock, wall=lambda: clock.now + 1.7e9)


def lease(fake_kube: FakeKube) -> dict[str, object]:
    obj = fake_kube.get("leases", "ops", "frscope")
    assert obj is not None
    return dict(obj["spec"])


async def test_one_holder_and_a_takeover_only_after_the_record_stood_still(
        fake_kube: FakeKube, kube_client: KubeClient) -> None:
    clock = Clock()
    a, b = elector(kube_client, "a", clock), elector(kube_client, "b", clock)
    assert await a.try_acquire_or_renew()  # creates it
    assert lease(fake_kube)["holderIdentity"] == "a" and lease(fake_kube)["leaseTransitions"] == 0
    assert not await b.try_acquire_or_renew()
    clock.now += 14
    assert await a.try_acquire_or_renew()  # a renews: b's clock starts again when b sees it
    clock.now += 1
    assert not await b.try_acquire_or_renew()
    clock.now += 14
    assert not await b.try_acquire_or_renew()
    clock.now += 1.5  # 15.5 s since b first saw a's last renewal
    assert await b.try_acquire_or_renew()
    spec = lease(fake_kube)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1 and spec["leaseDurationSeconds"] == 15
    assert str(spec["renewTime"]).endswith("Z") and "." in str(spec["renewTime"])  # MicroTime
    assert not await a.try_acquire_or_renew()  # a's next renewal finds b: a no longer leads


async def test_a_standby_that_just_started_waits_a_whole_duration_whatever_renewTime_says(
        fake_kube: FakeKube, kube_client: KubeClient) -> None:
    # The holder's renewTime is an hour old by this node's wall clock (skew, or a dead holder): the
    # standby still waits for the record to stand still for the duration on its own clock.
    clock = Clock()
    a = LeaderElector(kube_client, ElectionOptions("frscope", "ops", "a"), clock=clock,
                      wall=lambda: clock.now + 1.7e9 - 3600)
    assert await a.try_acquire_or_renew()
    b = elector(kube_client, "b", clock)
    assert not await b.try_acquire_or_renew()
    clock.now += 10
    assert not await b.try_acquire_or_renew()
    clock.now += 5
    assert await b.try_acquire_or_renew()


async def test_a_released_lease_is_taken_at_once(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    clock = Clock()
    a, b = elector(kube_client, "a", clock), elector(kube_client, "b", clock)
    await a.acquire()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert not lease(fake_kube).get("holderIdentity")
    assert await b.try_acquire_or_renew()


async def test_two_candidates_writing_at_once_make_one_leader(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    clock = Clock()
    candidates = [elector(kube_client, name, clock) for name in "abcd"]
    won = await asyncio.gather(*(c.try_acquire_or_renew() for c in candidates))
    assert sum(won) == 1
    assert lease(fake_kube)["holderIdentity"] == "abcd"[won.index(True)]


async def test_a_leader_that_cannot_renew_gives_up_before_a_standby_may_take_over(
        fake_kube: FakeKube, kube_client: KubeClient) -> None:
    clock = Clock()
    timing = {"duration_s": 1.5, "renew_deadline_s": 0.6, "retry_period_s": 0.1}
    a = elector(kube_client, "a", clock, **timing)
    await a.acquire()
    fake_kube.fail("PUT", "/leases/frscope", 503, times=1000)  # the API server refuses every write
    started = asyncio.get_running_loop().time()

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.05)
            clock.now += 0.05

    ticking = asyncio.create_task(tick())
    try:
        with pytest.raises(LeadershipLost, match="not renewed for 0.6 s"):
            await asyncio.wait_for(a.keep(), 10)
    finally:
        ticking.cancel()
    assert not a.leading and asyncio.get_running_loop().time() - started < 1.5


async def test_a_leader_that_finds_another_holder_stops_at_once(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    clock = Clock()
    a = elector(kube_client, "a", clock, duration_s=1.5, renew_deadline_s=1.0, retry_period_s=0.1)
    await a.acquire()
    obj = fake_kube.get("leases", "ops", "frscope")
    assert obj is not None
    fake_kube.put("leases", {**obj, "spec": {**obj["spec"], "holderIdentity": "intruder"}})
    with pytest.raises(LeadershipLost, match="held by intruder"):
        await asyncio.wait_for(a.keep(), 5)


def test_the_timing_must_leave_the_leader_time_to_stop() -> None:
    with pytest.raises(ValueError, match="must exceed the renew deadline"):
        ElectionOptions("frscope", "ops", "a", duration_s=10, renew_deadline_s=10, retry_period_s=2)
    with pytest.raises(ValueError, match="renew deadline"):
        ElectionOptions("frscope", "ops", "a", duration_s=15, renew_deadline_s=2, retry_period_s=2)
