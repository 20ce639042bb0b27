"""The sidecar against real gloo jobs on loopback, over the ranks' real worker-server sockets.

One 3-rank job hangs (rank 1 never returns from `load_batch`, ranks 0 and 2 wait in all_reduce #4
of the default group) and stays hung for the module; the tests start their own sidecars on it. A
second job (the straggler fault: 20 steps) shows progress while healthy.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.demo.faults import FAULT_STEP
from frscope.demo.launcher import LocalJob, start_job
from frscope.records import assemble, load_dumps
from tests.integration.test_sidecar_support import (
    POLL_S,
    STALL_S,
    config,
    decode,
    free_port,
    get,
    rank_dumps,
    running,
    tool,
    wait_until,
)

WORLD = 3
HUNG_SEQ = FAULT_STEP + 1  # all_reduce #4 of the default group
pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def hung() -> Iterator[LocalJob]:
    with start_job("hang", WORLD, lifetime_s=400) as job:
        deadline = time.monotonic() + 90
        while not all(job.socket_path(r).exists() for r in job.ranks()):
            assert all(job.alive(r) for r in job.ranks()), {r: job.log_tail(r) for r in job.ranks()}
            assert time.monotonic() < deadline, "the job's sockets never appeared"
            time.sleep(0.2)
        yield job


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.mark.timeout(150)
async def test_stall_flagged_in_time_and_stack_of_the_stuck_rank_captured(hung: LocalJob, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    started = time.time_ns()
    async with running(config(hung.work_dir, evidence_dir=tmp_path / "evidence", metrics_detail="rank-group"),
                       registry) as sidecar:
        await wait_until(lambda: sidecar.current_capture() is not None, 60, "a stall capture")
        # Every rank answered, the waiting ranks are stalled in all_reduce #4, the culprit is not in flight.
        state0 = sidecar.tracker.groups[(0, "0")]
        assert state0.stalled and state0.sample.inflight_op == "all_reduce"
        assert state0.sample.inflight_seq == HUNG_SEQ
        assert sidecar.tracker.groups[(2, "0")].stalled
        assert not sidecar.tracker.groups[(1, "0")].stalled
        assert sidecar.tracker.groups[(1, "0")].sample.inflight_op is None
        # Within --stall-after + one poll interval of the hang (or of the sidecar's start, for a hang
        # that began before it): the all_reduce's own enqueue time dates the hang. 0.3 s of slack
        # for the event loop's scheduling on a loaded machine.
        created = state0.sample.inflight_created_ns
        assert created is not None and state0.stalled_since_ns is not None
        begin = max(created + int(STALL_S * 1e9), started)
        assert state0.stalled_since_ns - begin <= (POLL_S + 0.3) * 1e9

        capture = sidecar.current_capture()
        assert capture is not None and capture.path is not None and capture.path.exists()
        # The capture: every rank's recorder and stacks; the stuck rank's stack names load_batch.
        status, headers, body = await get(sidecar, "/v1/snapshot", **{"Accept-Encoding": "gzip"})
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        snap = decode(headers, body)
        assert snap["schema"] == "frscope.sidecar.snapshot/v1" and snap["reason"] == "stall"
        assert (snap["pod"], snap["namespace"], snap["node"]) == ("trainer-worker-0", "ml", "node-a")
        assert [p["rank"] for p in snap["ranks"]] == [0, 1, 2] and snap["errors"] == []
        for piece in snap["ranks"]:
            assert set(piece) == {"frscope_snapshot", "rank", "captured_at_ns", "source", "stacks", "trace"}
            assert piece["source"] == f"socket:{hung.socket_path(piece['rank'])}"
            assert piece["trace"]["version"] == "2.10"
        stacks = {p["rank"]: p["stacks"] for p in snap["ranks"]}
        assert "in load_batch" in stacks[1]
        assert "all_reduce" in stacks[0] and "load_batch" not in stacks[0]

        # The same normalized model the operator and the CLI use: the verdict names rank 1 and its function.
        dumps = rank_dumps(snap)
        report = analyze(assemble(dumps.values(), []), AnalysisOptions(stall_after_s=1.0))
        root = report.findings[0]
        assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (1,)
        assert any(f.name == "load_batch" for f in root.culprit_stacks[1])
        # What frscope serves, frscope reads as it is: the body as served (gzip) and the capture the
        # sidecar kept on disk load like a folder of dumps (`frscope analyze snap.json.gz`).
        served = tmp_path / "snap.json.gz"
        served.write_bytes(body)
        for path in (served, capture.path):
            loaded = load_dumps([path])
            assert sorted(loaded.dumps) == [0, 1, 2] and not [p for p in loaded.problems if p.kind == "error"], path
            again = analyze(loaded, AnalysisOptions(stall_after_s=1.0)).findings[0]
            assert again.category is Category.RANK_NOT_JOINED and again.culprit_ranks == (1,)

        # Metrics, read from the injected registry.
        assert sample(registry, "frscope_collective_stalled", rank="0", pg="0") == 1
        assert sample(registry, "frscope_collective_stalled", rank="1", pg="0") == 0
        assert sample(registry, "frscope_collective_last_enqueued_seq", rank="0", pg="0") == HUNG_SEQ
        assert sample(registry, "frscope_collective_last_completed_seq", rank="0", pg="0") == HUNG_SEQ - 1
        assert sample(registry, "frscope_collective_last_completed_seq", rank="1", pg="0") == HUNG_SEQ - 1
        age = sample(registry, "frscope_collective_inflight_age_seconds", rank="0", pg="0")
        assert age is not None and age >= STALL_S
        assert sample(registry, "frscope_collectives_total", rank="0", pg="0", op="ALLREDUCE") == HUNG_SEQ
        assert sample(registry, "frscope_collectives_total", rank="1", pg="1", op="BROADCAST") == 1
        assert sample(registry, "frscope_worker_up", rank="2") == 1
        assert sample(registry, "frscope_stalls_total", rank="0", pg="0") == 1
        assert sample(registry, "frscope_dumps_collected_total", kind="stall_capture") == WORLD
        info = {"rank": "0", "backend": "gloo", "recorder_version": "2.10", "comm_lib_version": "unknown",
                "torch_version": "unknown"}
        assert sample(registry, "frscope_recorder_info", **info) == 1

        # /v1/status: cheap progress per rank and group.
        status, headers, body = await get(sidecar, "/v1/status")
        st = decode(headers, body)
        assert st["schema"] == "frscope.sidecar.status/v1" and st["stalled"] is True
        g = st["ranks"]["0"]["groups"]["0"]
        assert g["desc"] == "default_pg" and g["stalled"] and g["inflight_op"] == "all_reduce"
        assert g["inflight_seq"] == HUNG_SEQ and g["inflight_age_s"] >= STALL_S
        assert st["ranks"]["1"]["up"] and st["ranks"]["1"]["groups"]["0"]["stalled"] is False

        # Still the same stall a few polls later: one capture per episode.
        await asyncio.sleep(3 * POLL_S)
        assert len(sidecar.evidence.memory) == 1 and len(list((tmp_path / "evidence").iterdir())) == 1


@pytest.mark.timeout(120)
async def test_refresh_and_size_bound(hung: LocalJob) -> None:
    async with running(config(hung.work_dir, poll_interval_s=30.0)) as sidecar:
        status, headers, body = await get(sidecar, "/v1/snapshot?refresh=1", **{"Accept-Encoding": "identity"})
        assert status == 200 and "Content-Encoding" not in headers  # the client did not ask for gzip
        snap = decode(headers, body)
        assert snap["reason"] == "refresh" and [p["rank"] for p in snap["ranks"]] == [0, 1, 2]
        assert all(p["stacks"] and "Thread" in p["stacks"] for p in snap["ranks"])
        assert sidecar.registry.get_sample_value("frscope_dumps_collected_total", {"kind": "refresh"}) == WORLD
        one = max(len(str(p)) for p in snap["ranks"])
    # A cap that fits about one rank: the others are named in errors, never a torn body.
    async with running(config(hung.work_dir, poll_interval_s=30.0, max_snapshot_bytes=one + 2000)) as sidecar:
        status, headers, body = await get(sidecar, "/v1/snapshot?refresh=1", **{"Accept-Encoding": "identity"})
        snap = decode(headers, body)
        assert len(body) <= one + 2000
        assert 1 <= len(snap["ranks"]) < WORLD
        left_out = [e["rank"] for e in snap["errors"] if "max-snapshot-bytes" in e["message"]]
        assert sorted(left_out + [p["rank"] for p in snap["ranks"]]) == [0, 1, 2]


@pytest.mark.timeout(120)
async def test_bearer_token_protects_all_but_the_probes(hung: LocalJob, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    async with running(config(hung.work_dir, token_file=token_file)) as sidecar:
        assert (await get(sidecar, "/healthz"))[0] == 200
        await wait_until(lambda: sidecar.ready, 30, "the first poll")
        assert (await get(sidecar, "/readyz"))[0] == 200
        for path in ("/metrics", "/v1/status", "/v1/snapshot"):
            assert (await get(sidecar, path))[0] == 401
            assert (await get(sidecar, path, token="wrong"))[0] == 401
            assert (await get(sidecar, path, token="s3cret"))[0] == 200


@pytest.mark.timeout(150)
@pytest.mark.parametrize("detail", ["pod", "rank-group"])
async def test_promtool_checks_the_metrics_clean(hung: LocalJob, detail: str) -> None:
    promtool = tool("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (make deps-apt installs Debian's prometheus package)")
    async with running(config(hung.work_dir, metrics_detail=detail)) as sidecar:
        await wait_until(lambda: sidecar.current_capture() is not None, 60, "a stall capture")
        status, headers, body = await get(sidecar, "/metrics", **{"Accept-Encoding": "identity"})
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    for family in ("frscope_collective_stalled", "frscope_collective_duration_seconds", "frscope_recorder_info",
                   "frscope_worker_up", "frscope_poll_errors_total", "frscope_dumps_collected_total"):
        assert f"# TYPE {family.removesuffix('_total')}" in text, family
    done = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == b"" and done.stderr.strip() == b"", done


DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "frscope" / "files" / "frscope-dashboard.json"


def dashboard_exprs(title: str) -> list[str]:
    """A dashboard panel's queries with Grafana's variables at "All" (`.*`)."""
    panels = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p.get("title") == title]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    for var in ("namespace", "job", "pg", "op"):
        exprs = [e.replace(f"${var}", ".*") for e in exprs]
    return exprs


@pytest.mark.timeout(180)
async def test_real_prometheus_scrapes_the_stall(hung: LocalJob, tmp_path: Path) -> None:
    prometheus = tool("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (make deps-apt installs Debian's prometheus package)")
    token_file = tmp_path / "token"
    token_file.write_text("scrape-token")
    async with running(config(hung.work_dir, token_file=token_file)) as sidecar:
        prom_port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: frscope-sidecar\n"
            f"    authorization: {{credentials_file: {token_file}}}\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{sidecar.port}'], labels: {{pod: trainer-worker-0}}}}]\n"
        )
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir(),
        )
        try:
            base = f"http://127.0.0.1:{prom_port}"
            # The default series: one per pod (--metrics-detail pod), the pod's ranks and groups together.
            query = 'frscope_collective_stalled{job="frscope-sidecar"} == 1'
            deadline = time.monotonic() + 90
            result: list[dict[str, object]] = []
            async with aiohttp.ClientSession() as session:
                while time.monotonic() < deadline:
                    assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
                    try:
                        async with session.get(f"{base}/api/v1/query", params={"query": query},
                                               timeout=aiohttp.ClientTimeout(total=5)) as resp:
                            data = await resp.json()
                        result = data["data"]["result"] if data.get("status") == "success" else []
                    except (aiohttp.ClientError, TimeoutError):
                        result = []
                    if result:
                        break
                    await asyncio.sleep(1.0)
                assert [(r["metric"]["pod"], "rank" in r["metric"], "pg" in r["metric"])  # type: ignore[index,operator]
                        for r in result] == [("trainer-worker-0", False, False)], \
                    (tmp_path / "prometheus.log").read_text()[-3000:]
                # The scrape itself was healthy (and authenticated).
                async with session.get(f"{base}/api/v1/query", params={"query": 'up{job="frscope-sidecar"}'}) as resp:
                    up = (await resp.json())["data"]["result"]
                assert up and up[0]["value"][1] == "1"
                age_query = 'frscope_collective_inflight_age_seconds{job="frscope-sidecar"}'
                async with session.get(f"{base}/api/v1/query", params={"query": age_query}) as resp:
                    age = (await resp.json())["data"]["result"]
                assert float(age[0]["value"][1]) >= STALL_S
                # The dashboard's stall and in-flight panels draw the pod (its variables at "All").
                for title, want in (("Stalled ranks (pods)", 1.0), ("Stalled ranks (top 20)", 1.0),
                                    ("In-flight age, the 20 oldest ranks", STALL_S)):
                    (expr,) = dashboard_exprs(title)
                    async with session.get(f"{base}/api/v1/query", params={"query": expr}) as resp:
                        got = (await resp.json())["data"]["result"]
                    assert [r["metric"].get("pod") for r in got] == (
                        [None] if title.endswith("(pods)") else ["trainer-worker-0"]), (title, got)
                    assert float(got[0]["value"][1]) >= want, (title, got)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            log.close()


@pytest.mark.timeout(150)
async def test_progress_while_healthy() -> None:
    """The straggler job: 20 all_reduces, one every ~150 ms. Progress is seen, no stall is flagged."""
    registry = CollectorRegistry()
    with start_job("straggler", WORLD, lifetime_s=120) as job:
        async with running(config(job.work_dir, poll_interval_s=0.25), registry) as sidecar:
            seen: set[int] = set()
            stalled_ever = False

            def progressed() -> bool:
                nonlocal stalled_ever
                group = sidecar.tracker.groups.get((0, "0"))
                if group is not None and group.sample.last_enqueued_seq is not None:
                    seen.add(group.sample.last_enqueued_seq)
                stalled_ever = stalled_ever or bool(sidecar.tracker.stalled)
                done = job.phase(0) == "idle" and group is not None and group.sample.last_enqueued_seq == 20
                return done and not group.sample.inflight  # type: ignore[union-attr]

            await wait_until(progressed, 100, "the straggler job to finish its 20 steps", step_s=0.05)
            await asyncio.sleep(2 * 0.25)
            progressed()
            assert len(seen) >= 4, seen  # several polls saw a different last enqueued collective
            assert not stalled_ever and sidecar.current_capture() is None
            for rank in range(WORLD):
                assert registry.get_sample_value("frscope_worker_up", {"rank": str(rank)}) == 1
            # The default series, one per pod (--metrics-detail pod): every rank's 20 all_reduces, nothing stalled,
            # and no series per rank and group.
            assert registry.get_sample_value("frscope_collectives_total", {"op": "ALLREDUCE"}) == 20 * WORLD
            assert registry.get_sample_value("frscope_collective_stalled") == 0
            assert registry.get_sample_value("frscope_collective_inflight_age_seconds") == 0
            assert registry.get_sample_value("frscope_collective_stalled", {"rank": "0", "pg": "0"}) is None
            assert not [m for m in registry.collect() if m.name == "frscope_collective_last_completed_seq"]
            assert registry.get_sample_value("frscope_polls_total") >= 4  # type: ignore[operator]
