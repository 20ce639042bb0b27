"""The API client on a faked wire: typed errors, retries with backoff on 429/5xx/transport errors,
and conflict retries around a whole read-modify-write."""

from __future__ import annotations

import aiohttp
import pytest

from frscope.operator.kube import (
    PODS,
    PYTORCHJOBS,
    REPORTS,
    AlreadyExists,
    Backoff,
    Conflict,
    Forbidden,
    KubeClient,
    NotFound,
    ServerError,
    TooManyRequests,
    TransportError,
    retry_on_conflict,
)
from tests.unit.operator import builders
from tests.unit.operator.fakes import FakeKube


async def test_paths_and_typed_errors(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    fake_kube.put("pytorchjobs", builders.job())
    job = await kube_client.get(PYTORCHJOBS, "ml", "train")
    assert job["metadata"]["name"] == "train"
    assert fake_kube.requests[-1][1] == "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/train"
    with pytest.raises(NotFound) as exc:
        await kube_client.get(PYTORCHJOBS, "ml", "nope")
    assert exc.value.status == 404 and "nope" in exc.value.message
    body = {"apiVersion": "frscope.io/v1alpha1", "kind": "FlightRecorderReport", "metadata": {"name": "r1"}}
    await kube_client.create(REPORTS, "ml", body)
    with pytest.raises(AlreadyExists):
        await kube_client.create(REPORTS, "ml", body)
    fake_kube.fail("GET", "/pytorchjobs/train", 403)
    with pytest.raises(Forbidden):
        await kube_client.get(PYTORCHJOBS, "ml", "train")
    assert await kube_client.server_version() == (1, 31)


async def test_retries_429_and_5xx_then_succeeds(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    fake_kube.put("pytorchjobs", builders.job())
    fake_kube.fail("GET", "/pytorchjobs/train", 429, headers={"Retry-After": "0"})
    fake_kube.fail("GET", "/pytorchjobs/train", 503)
    fake_kube.fail("GET", "/pytorchjobs/train", 500)
    job = await kube_client.get(PYTORCHJOBS, "ml", "train")
    assert job["metadata"]["name"] == "train"
    assert sum(1 for m, p, _ in fake_kube.requests if p.endswith("/train")) == 4


async def test_gives_up_after_the_attempts(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    fake_kube.put("pytorchjobs", builders.job())
    fake_kube.fail("GET", "/pytorchjobs/train", 500, times=10)
    with pytest.raises(ServerError):
        await kube_client.get(PYTORCHJOBS, "ml", "train")
    assert len(fake_kube.requests) == 4  # Backoff(attempts=4) in the fixture
    fake_kube.faults.clear()
    fake_kube.fail("GET", "/pytorchjobs/train", 429, times=10)
    with pytest.raises(TooManyRequests):
        await kube_client.get(PYTORCHJOBS, "ml", "train")


async def test_transport_errors_are_typed_and_retried() -> None:
    client = KubeClient(aiohttp.ClientSession(), "http://127.0.0.1:9", backoff=Backoff(attempts=2, base_s=0.01))
    try:
        with pytest.raises(TransportError):
            await client.get(PYTORCHJOBS, "ml", "train")
    finally:
        await client.close()


async def test_conflict_retries_the_whole_cycle(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    fake_kube.put("pytorchjobs", builders.job())
    calls = 0

    async def annotate() -> None:
        nonlocal calls
        calls += 1
        job = await kube_client.get(PYTORCHJOBS, "ml", "train")
        rv = job["metadata"]["resourceVersion"]
        if calls == 1:  # someone else writes between our read and our write
            fake_kube.put("pytorchjobs", job)
        await kube_client.merge_patch(PYTORCHJOBS, "ml", "train",
                                      {"metadata": {"resourceVersion": rv, "annotations": {"a": str(calls)}}})

    await retry_on_conflict(annotate, Backoff(attempts=3, base_s=0.01))
    assert calls == 2
    assert fake_kube.get("pytorchjobs", "ml", "train")["metadata"]["annotations"]["a"] == "2"  # type: ignore[index]


async def test_already_exists_is_not_retried_as_a_conflict(kube_client: KubeClient) -> None:
    calls = 0

    async def create() -> None:
        nonlocal calls
        calls += 1
        raise AlreadyExists(409, "AlreadyExists", "x")

    with pytest.raises(AlreadyExists):
        await retry_on_conflict(create)
    assert calls == 1
    assert issubclass(AlreadyExists, Conflict)


async def test_a_list_is_read_in_pages_to_the_end(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    """A job of tens of thousands of pods is past one answer's byte cap: the list is read in `limit`
    chunks, following each `continue` token, and every object comes back once."""
    for i in range(1_205):
        fake_kube.put("pods", {"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": f"train-worker-{i}", "namespace": "ml", "labels": {"job": "t"}}})
    before = len(fake_kube.requests)
    pods = await kube_client.list(PODS, "ml", label_selector="job=t")
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(f"train-worker-{i}" for i in range(1_205))
    assert len(fake_kube.requests) - before == 3  # 500 + 500 + 205


async def test_pages_come_one_at_a_time(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    """`pages` hands each page over before it asks for the next (its caller keeps a record of each pod
    and drops the page: the operator never holds a 32,768-pod list's raw objects at once)."""
    for i in range(1_205):
        fake_kube.put("pods", {"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": f"train-worker-{i}", "namespace": "ml", "labels": {"job": "t"}}})
    before = len(fake_kube.requests)
    sizes: list[tuple[int, int]] = []
    async for page in kube_client.pages(PODS, "ml", label_selector="job=t"):
        sizes.append((len(page), len(fake_kube.requests) - before))
    assert sizes == [(500, 1), (500, 2), (205, 3)]
