"""The dashboard's step-boundary lateness panel, evaluated by a real Prometheus (Debian's package) over two
real sidecars beside a real straggler job.

The job is frscope/demo's `steps` fault (gloo, loopback, 3 ranks): rank 2's data loader takes 0.4 s
longer before each of 8 steps of 4 all_reduces, so ranks 0 and 1 wait for it at every step's first
all_reduce and the rest of each step runs in lockstep. The ranks are split over two "pods" as a
multi-node job would be: one sidecar sees ranks 0 and 1, the other only rank 2. Neither can tell alone
that rank 2 is late (each only counts its own ranks' time in collectives); the panel's query, the
dashboard's own expression, does it across the pods in PromQL.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from frscope.demo.faults import LAYER_STEPS, STEP_LATE_S, culprit_ranks
from frscope.demo.launcher import start_job
from tests.integration.test_sidecar_support import config, free_port, running, tool, wait_until

pytestmark = [pytest.mark.torch, pytest.mark.slow]
DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "frscope" / "files" / "frscope-dashboard.json"
WORLD = 3
PODS = {"trainer-worker-0": (0, 1), "trainer-worker-1": (2,)}
LABELS = {"namespace": "ml", "training_job": "demo", "job_kind": "pytorchjob"}
POLL_S = 0.05  # gloo has no durations: the sidecar samples at each poll, so poll often for a short job


def lateness_query(range_s: int) -> str:
    """The panel's expression, as Grafana sends it for namespace ml, job demo and this time range."""
    dashboard = json.loads(DASHBOARD.read_text())
    [expr] = [t["expr"] for p in dashboard["panels"] if p["type"] not in ("row", "text") for t in p["targets"]
              if "frscope_collective_wait_seconds_total" in t["expr"]]
    out = str(expr).replace("$__range", f"{range_s}s").replace("$namespace", "ml").replace("$job", "demo")
    assert "$" not in out, out
    return out


async def query(session: aiohttp.ClientSession, base: str, expr: str) -> list[dict[str, Any]]:
    async with session.get(f"{base}/api/v1/query", params={"query": expr},
                           timeout=aiohttp.ClientTimeout(total=10)) as resp:
        data = await resp.json()
    assert data.get("status") == "success", data
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


@pytest.mark.timeout(240)
async def test_panel_names_the_rank_late_at_step_boundaries(tmp_path: Path) -> None:
    prometheus = tool("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (make deps-apt installs Debian's prometheus package)")
    started = time.monotonic()
    # Prometheus scrapes the sidecars before the job starts, as it would in a cluster where it runs all
    # along: increase() cannot count what came before a series' first sample (on a quiet machine the job
    # ran all its steps before Prometheus' first scrape, and every rank read 0). So the sidecars and
    # Prometheus start first, on socket dirs whose links lead through `job`, a link made to the job's
    # socket dir once it is started (until then they see no rank); the ranks' counters appear with their
    # sockets, right before the first step, and are scraped every 250 ms.
    through = tmp_path / "job"
    dirs = {}
    for pod, ranks in PODS.items():
        dirs[pod] = tmp_path / pod
        dirs[pod].mkdir()
        for rank in ranks:
            (dirs[pod] / f"rank-{rank}.sock").symlink_to(through / f"rank-{rank}.sock")
    ports = {pod: free_port() for pod in PODS}
    cfgs = [config(dirs[pod], port=ports[pod], pod=pod, poll_interval_s=POLL_S, stall_after_s=60.0) for pod in PODS]
    async with running(cfgs[0]) as first, running(cfgs[1]) as second:
        prom_port = free_port()
        (tmp_path / "prometheus.yml").write_text(json.dumps({  # (YAML reads JSON)
            "global": {"scrape_interval": "250ms", "evaluation_interval": "1s", "scrape_timeout": "250ms"},
            "scrape_configs": [{
                "job_name": "frscope-sidecars",
                "static_configs": [{"targets": [f"127.0.0.1:{ports[pod]}"], "labels": {**LABELS, "pod": pod}}
                                   for pod in PODS],
            }],
        }))
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir(),
        )
        try:
            base = f"http://127.0.0.1:{prom_port}"
            async with aiohttp.ClientSession() as session:

                async def count(expr: str) -> int:
                    assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
                    try:
                        found = await query(session, base, f"count({expr})")
                    except aiohttp.ClientError:
                        return 0
                    return int(found[0]["value"][1]) if found else 0

                async def scraped(expr: str, n: int) -> None:
                    deadline = time.monotonic() + 60
                    while await count(expr) < n:
                        assert time.monotonic() < deadline, f"Prometheus never had {n} of {expr}"
                        await asyncio.sleep(0.25)

                await scraped('up{training_job="demo"} == 1', len(PODS))
                with start_job("steps", WORLD, lifetime_s=200) as job:
                    through.symlink_to(job.work_dir)
                    # The job runs its 8 steps, then every rank idles.
                    await wait_until(lambda: all(job.phase(r) == "idle" for r in job.ranks()), 150,
                                     "the steps job to finish", step_s=0.2)
                    assert {s.rank for s in first.ranks.values()} | {s.rank for s in second.ranks.values()} == {0, 1, 2}
                    assert set(second.ranks) == {2}  # the late rank's pod sees no other rank
                    # Every sample up to the idle job scraped (the counters stop moving once idle).
                    await asyncio.sleep(3.0)
                    window = int(time.monotonic() - started) + 30
                    result = await query(session, base, lateness_query(window))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            log.close()

    late = {int(r["metric"]["rank"]): float(r["value"][1]) for r in result}
    assert set(late) == {0, 1, 2}, result
    assert {r["metric"]["training_job"] for r in result} == {"demo"}
    [culprit] = culprit_ranks("steps", WORLD)
    expected = LAYER_STEPS * STEP_LATE_S  # 3.2 s: what ranks 0 and 1 waited for it in all
    # The late rank: the most, about what the others waited for it (polls sample the waits).
    assert max(late, key=lambda r: late[r]) == culprit, late
    assert 0.5 * expected <= late[culprit] <= 1.3 * expected, late
    # The ranks on time: none of the others waited for them.
    for rank in set(late) - {culprit}:
        assert late[rank] <= 0.15 * expected, late
    # The query's first result row is the late rank (sort_desc: the bar on top).
    assert int(result[0]["metric"]["rank"]) == culprit
