from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from frscope.operator.kube import Backoff, KubeClient
from tests.unit.operator.fakes import FakeKube, StandInSidecar, real_snapshots


@pytest.fixture
async def fake_kube() -> AsyncIterator[FakeKube]:
    kube = await FakeKube().start()
    yield kube
    await kube.close()


@pytest.fixture
async def kube_client(fake_kube: FakeKube) -> AsyncIterator[KubeClient]:
    client = KubeClient(aiohttp.ClientSession(), fake_kube.url,
                        backoff=Backoff(attempts=4, base_s=0.01, cap_s=0.05), timeout_s=5)
    yield client
    await client.close()


@pytest.fixture
def hang_ranks() -> dict[int, dict[str, Any]]:
    return real_snapshots("hang")


@pytest.fixture
async def sidecars() -> AsyncIterator[Callable[..., Awaitable[StandInSidecar]]]:
    started: list[StandInSidecar] = []

    async def make(pod: str, ranks: dict[int, dict[str, Any]], **kwargs: Any) -> StandInSidecar:
        sidecar = await StandInSidecar(pod, ranks, **kwargs).start()
        started.append(sidecar)
        return sidecar

    yield make
    for sidecar in started:
        await sidecar.close()
