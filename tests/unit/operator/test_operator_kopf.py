"""The whole operator in-process, kopf included, on a faked wire: FakeKube serves discovery, lists and
watch streams to kopf and takes the writes; stand-in sidecars serve REAL recorder snapshots of a real
hung gloo job (they stand in for `frscope sidecar` so the test needs no torch process and runs in
seconds; tests/e2e runs the real sidecar and the real API server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from frscope.operator import names
from frscope.operator.engine.settings import OperatorConfig
from frscope.operator.evidence.gather import GatherOptions
from frscope.operator.kube.api_client import LIST_PAGE
from frscope.operator.runner import Operator, serve
from tests.unit.operator import builders
from tests.unit.operator.fakes import FakeKube, StandInSidecar

Make = Callable[..., Awaitable[StandInSidecar]]


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "op", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "op"}}],
    }))
    return path


async def eventually(what: str, probe: Callable[[], Any], timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(60)
async def test_kopf_watches_route_a_stall_into_a_published_diagnosis(
        fake_kube: FakeKube, sidecars: Make, hang_ranks: dict[int, Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", fake_kube.url)))
    fake_kube.put("pytorchjobs", builders.job(workers=1, nproc=2))
    s0 = await sidecars("train-master-0", {r: v for r, v in hang_ranks.items() if r < 2})
    s1 = await sidecars("train-worker-0", {r: v for r, v in hang_ranks.items() if r >= 2})
    fake_kube.put("pods", builders.pod(s0.pod, replica_type="Master", port=s0.port))
    # A pod of some other workload: no job label, never looked at.
    other = builders.pod("web-0", port=s1.port)
    del other["metadata"]["labels"][names.LABEL_JOB_NAME]
    fake_kube.put("pods", other)

    config = OperatorConfig(http_host="127.0.0.1", http_port=0, poll_interval_s=0.2, stuck_after_s=0.5,
                            decode_processes=0,
                            gather=GatherOptions(per_pod_timeout_s=2, overall_timeout_s=5, attempts=2))
    stop = asyncio.Event()
    started: list[Operator] = []

    async def ui(_: web.Request) -> web.Response:
        return web.Response(text="ui")

    def mount(op: Operator) -> None:
        op.http.add_routes([web.get("/ui/", ui)])

    task = asyncio.create_task(serve(config, registry=CollectorRegistry(), stop_flag=stop,
                                     on_ready=started.append, mount=mount))
    try:
        op = (await eventually("the operator", lambda: started))[0]
        # The second pod arrives through kopf's watch stream, after the initial listing.
        fake_kube.put("pods", builders.pod(s1.pod, port=s1.port))
        await eventually("the pods in the store",
                         lambda: len(op.store.jobs()[0].pods) == 2 if op.store.jobs() else 0)
        [report] = await eventually("the report", lambda: fake_kube.of("flightrecorderreports"))
        assert report["diagnosis"]["who"]["culpritRanks"] == [1]
        job = await eventually("the condition", lambda: (j := fake_kube.get("pytorchjobs", "ml", "train"))
                               and j["status"]["conditions"][0]["type"] == names.CONDITION_TYPE and j)
        assert job["status"]["conditions"][-1]["type"] == "Running"
        view = await eventually("the latest diagnosis in the store", lambda: (v := op.store.jobs()[0]).latest and v)
        assert view.latest is not None and view.latest.category == "RankNotJoined" and view.stalled
        assert [p.name for p in view.pods] == ["train-master-0", "train-worker-0"]
        async with aiohttp.ClientSession() as session:
            assert op.http.port is not None
            base = f"http://127.0.0.1:{op.http.port}"
            async with session.get(base + "/ui/") as r:
                assert await r.text() == "ui"
            async with session.get(base + "/readyz") as r:
                assert r.status == 200
        # Pods are listed and watched with a server-side selector: other workloads' pods never arrive
        # (the watch; and the list of the job's own pods before a gather).
        pod_selectors = {sel for plural, sel in fake_kube.selectors if plural == "pods"}
        assert pod_selectors == {f"{names.INJECT_KEY}=true",
                                 f"{names.INJECT_KEY}=true,training.kubeflow.org/job-name=train"}
        # Every list of pods, kopf's first one too, is read in pages (one answer of a 32,768-pod job, parsed
        # whole, was ~0.6 GiB: bench/pod_watch_memory.py).
        pod_lists = [limit for plural, limit in fake_kube.list_pages if plural == "pods"]
        assert len(pod_lists) >= 2 and set(pod_lists) == {str(LIST_PAGE)}
        await asyncio.sleep(1)  # more sweeps of the same stall
        assert len(fake_kube.of("flightrecorderreports")) == 1 and len(fake_kube.of("events")) == 1
        # kopf itself wrote nothing: every write is frscope's, to the job, its status, Events and reports.
        for method, path, body in fake_kube.writes():
            assert "/pods" not in path, (method, path)
            assert "finalizers" not in str(body) and "kopf" not in str(body), (method, path, body)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
