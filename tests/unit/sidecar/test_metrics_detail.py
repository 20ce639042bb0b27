"""--metrics-detail: the collective series of a pod aggregated over its ranks and groups by default (a count
that does not grow with the groups a rank is in), one series per rank and group when asked (issue 35).

The pod: 8 ranks of a 3-D parallel job (frscope.testing.synthetic: tp 8 in the pod, pp 2, dp 4), hung
(a rank of another pod never joined a data-parallel reduce-scatter). The ranks' worker servers are
stand-ins (aiohttp on unix sockets answering `fr_trace_json` with the synthetic job's recorders: its other
ranks cannot run here); the sidecar, its poll rounds, registry and /metrics are the real ones.
bench/metrics_series.py measures the same for an 8,192-rank job.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from frscope.sidecar.app import Sidecar
from frscope.sidecar.config import SidecarConfig
from frscope.sidecar.metrics import SidecarMetrics
from frscope.testing.synthetic.hung_step import make_plan

pytestmark = pytest.mark.timeout(60)
POD = range(8, 16)  # the job's second pod


def _recorders(pp: int) -> dict[int, bytes]:
    plan = make_plan(64, tp=8, pp=pp, scenario="not_joined", culprit=63, entries=400)
    return {rank: json.dumps(plan.dump(rank, json_shape=True)).encode() for rank in POD}


@asynccontextmanager
async def _ranks(directory: Path, bodies: dict[int, bytes]) -> AsyncIterator[None]:
    runners = []
    for rank, body in bodies.items():
        async def fr_trace_json(request: web.Request, body: bytes = body) -> web.Response:
            return web.Response(body=body, content_type="application/json")

        app = web.Application()
        app.router.add_post("/handler/fr_trace_json", fr_trace_json)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.UnixSite(runner, str(directory / f"rank-{rank}.sock")).start()
        runners.append(runner)
    try:
        yield
    finally:
        for runner in runners:
            await runner.cleanup()


async def _exposition(tmp_path: Path, detail: str, pp: int) -> tuple[CollectorRegistry, list[str]]:
    sockets = tmp_path / f"{detail}-{pp}"
    sockets.mkdir()
    registry = CollectorRegistry()
    config = SidecarConfig(socket_dir=sockets, evidence_dir=None, host="127.0.0.1", port=0, stall_after_s=0.2,
                           suspect_min_s=0.05, suspect_after_s=0.1, metrics_detail=detail)
    async with _ranks(sockets, _recorders(pp)):
        sidecar = Sidecar(config, registry)
        try:
            for _ in range(40):
                await sidecar.poll_once(full=True)
                if sidecar.tracker.stalled:
                    break
            assert sidecar.tracker.stalled
            groups = {pg for (_rank, pg) in sidecar.tracker.groups}
            assert len(groups) == (2 + 2 * 8 if pp == 2 else 2 + 8)  # default, tp, and a pp/dp group per rank
        finally:
            await sidecar.stop()
    from prometheus_client import generate_latest

    lines = [line for line in generate_latest(registry).decode().splitlines() if line and not line.startswith("#")]
    return registry, lines


def _collective_series(lines: list[str]) -> list[str]:
    """The series of the families that are per rank x group in the detail."""
    names = ("frscope_collective_stalled", "frscope_collective_suspected", "frscope_collective_inflight_age_seconds",
             "frscope_stalls_total", "frscope_collective_last_", "frscope_collective_stall_threshold",
             "frscope_collective_suspect_threshold", "frscope_collective_usual_wait")
    return [line for line in lines if line.startswith(names)]


async def test_by_default_one_series_per_pod_whatever_the_groups(tmp_path: Path) -> None:
    registry, three_d = await _exposition(tmp_path, "pod", pp=2)
    _, two_d = await _exposition(tmp_path, "pod", pp=1)
    # Four series for the pod (stalled, suspected, in-flight age, stalls), without rank or pg, whether its
    # ranks are in three groups each or four.
    assert sorted(line.split(" ")[0] for line in _collective_series(three_d)) == [
        "frscope_collective_inflight_age_seconds", "frscope_collective_stalled", "frscope_collective_suspected",
        "frscope_stalls_total"]
    assert len(_collective_series(two_d)) == 4
    assert registry.get_sample_value("frscope_collective_stalled") == 1
    assert (registry.get_sample_value("frscope_collective_inflight_age_seconds") or 0) > 0
    assert (registry.get_sample_value("frscope_stalls_total") or 0) >= 1
    # The collective counter by op only: the pod's ranks together.
    ops = [line for line in three_d if line.startswith("frscope_collectives_total")]
    assert ops and all(line.startswith("frscope_collectives_total{op=") for line in ops)
    assert not [line for line in three_d if 'pg="' in line]


async def test_rank_group_keeps_a_series_per_rank_and_group(tmp_path: Path) -> None:
    registry, lines = await _exposition(tmp_path, "rank-group", pp=2)
    stalled = [line for line in lines if line.startswith("frscope_collective_stalled{")]
    assert len(stalled) == len(POD) * 4  # every rank of the pod, in each of its four groups
    assert registry.get_sample_value("frscope_collective_last_completed_seq", {"rank": "8", "pg": "0"}) is not None
    # The pod's aggregate is the same information summed up: some group of some rank stalled.
    assert max(float(line.rsplit(" ", 1)[1]) for line in stalled) == 1.0
    # stalled, suspected, in-flight age, both thresholds and the rhythm for every rank and group, and more
    assert len(_collective_series(lines)) > 6 * len(POD) * 4


def test_an_unknown_detail_is_refused() -> None:
    with pytest.raises(ValueError, match="metrics detail 'rank'"):
        SidecarMetrics(CollectorRegistry(), "rank")
