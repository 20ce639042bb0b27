"""The web UI over the operator's store (`frscope.operator.serve.ui`), fed through the operator's own path: kopf-shaped
job and pod bodies into the controller, the status poller sweeping stand-in sidecars (REAL recorder snapshots of
a hung gloo job), the controller's diagnosis and publication against a fake API server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from frscope.operator.engine.controller import Controller
from frscope.operator.engine.settings import OperatorConfig
from frscope.operator.evidence.gather import GatherOptions
from frscope.operator.evidence.incident_bundles import IncidentBundles
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.kube import Backoff, KubeClient
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.model.store import JobStore, without_report
from frscope.operator.publish import Publisher
from frscope.operator.serve.operator_http import Health, OperatorHttp
from frscope.operator.serve.status_poller import StatusPoller
from frscope.operator.serve.ui import OperatorJobs, mount_ui
from tests.unit.operator import builders
from tests.unit.operator.fakes import FakeKube, StandInSidecar, real_snapshots

CONFIG = OperatorConfig(decode_processes=0, stuck_after_s=0.5, cooldown_s=60,
                        gather=GatherOptions(per_pod_timeout_s=1, overall_timeout_s=3, attempts=2,
                                             backoff_base_s=0.01))


class Rig:
    """One watched job (2 pods x 2 ranks) in a real controller, store, poller and HTTP server with the UI."""

    def __init__(self) -> None:
        self.kube = FakeKube()
        self.sidecars: list[StandInSidecar] = []

    async def start(self, *, ui_poll_s: float = 0.2, store: JobStore | None = None,
                    bundles: IncidentBundles | None = None) -> Rig:
        await self.kube.start()
        self.kube_client = KubeClient(aiohttp.ClientSession(), self.kube.url,
                                      backoff=Backoff(attempts=4, base_s=0.01, cap_s=0.05), timeout_s=5)
        self.session = aiohttp.ClientSession()
        registry = CollectorRegistry()
        metrics = OperatorMetrics(registry)
        self.store = store if store is not None else JobStore()
        self.controller = Controller(CONFIG, store=self.store, pushes=PushStore(),
                                     sidecars=SidecarClient(self.session),
                                     publisher=Publisher(self.kube_client, instance="op-0"), metrics=metrics,
                                     bundles=bundles)
        self.poller = StatusPoller(self.controller, interval_s=1, timeout_s=1, max_rps=1000, concurrency=8)
        self.http = OperatorHttp(registry=registry, metrics=metrics, health=Health(),
                                 on_push=self.controller.on_push)
        mount_ui(self.http, self.store, poll_s=ui_poll_s, bundles=bundles)
        self.port = await self.http.start("127.0.0.1", 0)
        ranks = real_snapshots("hang")
        await self.controller.on_job(None, self.kube.put("pytorchjobs", builders.job(workers=1, nproc=2)))
        for pod, kind, mine in (("train-master-0", "Master", {r: v for r, v in ranks.items() if r < 2}),
                                ("train-worker-0", "Worker", {r: v for r, v in ranks.items() if r >= 2})):
            sidecar = await StandInSidecar(pod, mine, stalled=False).start()
            self.sidecars.append(sidecar)
            await self.controller.on_pod("ADDED", builders.pod(pod, replica_type=kind, port=sidecar.port))
        return self

    @property
    def master(self) -> StandInSidecar:
        return self.sidecars[0]

    @property
    def worker(self) -> StandInSidecar:
        return self.sidecars[1]

    async def sweep(self) -> None:
        """One status sweep, as the operator's poller runs it (stalls start diagnoses in the background)."""
        await self.poller.sweep()

    async def close(self) -> None:
        await self.controller.close()
        await self.http.stop()
        for sidecar in self.sidecars:
            await sidecar.close()
        await self.session.close()
        await self.kube_client.close()
        await self.kube.close()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    r = await Rig().start()
    yield r
    await r.close()


def states(detail: Any) -> dict[int, str]:
    return {r: s.state for r, s in detail.ranks.items()}


async def test_status_only_then_live_states_then_the_diagnosis(rig: Rig) -> None:
    ui = OperatorJobs(rig.store)
    # known before any sweep: listed, not diagnosed, no ranks yet
    [summary] = ui.jobs()
    assert (summary.namespace, summary.name, summary.verdict, summary.healthy) == ("ml", "train", None, None)
    assert summary.state == "Running" and summary.world_size == 4 and not summary.stalled
    assert ui.job("ml", "nope") is None

    await rig.sweep()
    first = ui.job("ml", "train")
    assert first is not None and first.report is None and first.timeline is None
    assert states(first) == {0: "ok", 1: "ok", 2: "ok", 3: "ok"}
    assert first.summary.updated_at is not None
    await rig.sweep()  # nothing changed: same revision (the page does not refetch)
    again = ui.job("ml", "train")
    assert again is not None and again.revision == first.revision

    rig.worker.mode = "down"  # its sidecar stops answering: its ranks are unreachable (ranks it reported last)
    await rig.sweep()
    down = ui.job("ml", "train")
    assert down is not None and down.revision != first.revision
    assert states(down) == {0: "ok", 1: "ok", 2: "unreachable", 3: "unreachable"}
    assert "train-worker-0" in down.ranks[2].detail and "503" in down.ranks[2].detail

    rig.worker.mode = "ok"
    rig.worker.stalled = True  # the worker's ranks stall: the controller diagnoses in the background
    await rig.sweep()
    stalled = ui.job("ml", "train")
    assert stalled is not None and states(stalled)[2] == "stalled" and stalled.summary.stalled
    assert "all_reduce #4" in stalled.ranks[2].detail
    await rig.controller.idle()

    diagnosed = ui.job("ml", "train")
    assert diagnosed is not None and diagnosed.report is not None and diagnosed.timeline is not None
    assert diagnosed.revision not in (first.revision, stalled.revision)
    s = diagnosed.summary
    assert s.category == "RankNotJoined" and s.culprit_ranks == (1,) and s.healthy is False
    assert s.verdict == diagnosed.report["verdict"] and "1" in s.verdict
    assert diagnosed.timeline["world_size"] == 4 and diagnosed.timeline["culprit_ranks"] == [1]
    [listed] = ui.jobs()
    assert listed.verdict == s.verdict and listed.culprit_ranks == (1,)
    # listings drop the heavy parts
    view = rig.store.jobs()[0]
    assert view.latest is not None and view.latest.timeline is not None
    light = without_report(view).latest
    assert light is not None and light.report == {} and light.timeline is None


async def test_failed_pod_and_missing_ranks(rig: Rig) -> None:
    rig.master.ranks = {0: rig.master.ranks[0]}  # rank 1 is reported by nobody
    await rig.sweep()
    await rig.controller.on_pod("MODIFIED", builders.pod("train-worker-0", port=rig.worker.port, phase="Failed"))
    detail = OperatorJobs(rig.store).job("ml", "train")
    assert detail is not None
    assert states(detail) == {0: "ok", 1: "missing", 2: "failed", 3: "failed"}


async def test_mounted_at_ui_in_the_operator_http_server(rig: Rig) -> None:
    await rig.sweep()
    base = f"http://127.0.0.1:{rig.port}/ui"
    async with aiohttp.ClientSession() as session:
        async with session.get(base + "/api/jobs") as r:
            assert r.status == 200
            body = await r.json()
        assert [(j["namespace"], j["name"]) for j in body["jobs"]] == [("ml", "train")]
        async with session.get(base + "/jobs/ml/train/data") as r:
            data = await r.json()
        assert data["report"] is None and data["status"]["0"]["state"] == "ok"
        async with session.get(base + "/") as r:
            assert r.status == 200 and "text/html" in r.headers["Content-Type"]
        async with session.get(f"http://127.0.0.1:{rig.port}/healthz") as r:
            assert r.status == 200
