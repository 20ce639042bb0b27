"""The web UI's routes on a real aiohttp server (loopback), over the in-memory provider."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from frscope.analysis import AnalysisOptions, analyze
from frscope.records import load_dumps
from frscope.report import report_to_dict
from frscope.report.timeline import build_timeline
from frscope.webui import JobDetail, JobSummary, MemoryProvider, RankStatus, create_app, detail_revision

REAL = Path(__file__).parents[2] / "data" / "real"


def real(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    dumpset = load_dumps([REAL / name])
    report = analyze(dumpset, AnalysisOptions(stall_after_s=1.0))
    return report_to_dict(report), build_timeline(dumpset, report)


@pytest.fixture
def provider() -> MemoryProvider:
    p = MemoryProvider()
    report, timeline = real("hang")
    p.put("ml", "resnet", report=report, timeline=timeline, ranks={0: RankStatus("stalled"), 1: RankStatus("ok")})
    p.put("ml", "empty")
    return p


@pytest.fixture
async def client(provider: MemoryProvider) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    parent = web.Application()
    parent.add_subapp("/ui", create_app(provider, poll_s=0.05, keepalive_s=0.2))
    async with TestClient(TestServer(parent)) as c:
        yield c


async def test_job_list(client: TestClient[web.Request, web.Application]) -> None:
    r = await client.get("/ui/", allow_redirects=False)
    assert r.status == 200
    text = await r.text()
    assert "ml/resnet" in text and "never joined" in text and "Content-Security-Policy" in text
    r = await client.get("/ui/api/jobs")
    jobs = (await r.json())["jobs"]
    assert [(j["namespace"], j["name"]) for j in jobs] == [("ml", "empty"), ("ml", "resnet")]
    resnet = jobs[1]
    assert resnet["healthy"] is False and resnet["culprit_ranks"] == [1] and resnet["category"] == "RankNotJoined"


async def test_job_page_embeds_data_and_relative_live_urls(client: TestClient[web.Request, web.Application]) -> None:
    r = await client.get("/ui/jobs/ml/resnet")
    assert r.status == 200
    text = await r.text()
    assert "connect-src 'self'" in text
    start = text.index('id="frscope-data">') + len('id="frscope-data">')
    data = json.loads(text[start : text.index("</script>", start)])
    assert data["live"]["data_url"] == "resnet/data" and data["live"]["events_url"] == "resnet/events"
    assert data["timeline"]["culprit_ranks"] == [1]
    assert data["status"]["0"]["state"] == "stalled"
    r = await client.get("/ui/jobs/ml/nope")
    assert r.status == 404


async def test_data_and_summary(client: TestClient[web.Request, web.Application], provider: MemoryProvider) -> None:
    r = await client.get("/ui/jobs/ml/resnet/data", headers={"Accept-Encoding": "gzip"})
    data = await r.json()
    assert set(data) == {"summary", "report", "timeline", "status", "perf", "revision"}
    assert data["report"]["findings"][0]["culprit_ranks"] == [1]
    first = data["revision"]
    r = await client.get("/ui/jobs/ml/resnet/summary")
    assert (await r.json())["revision"] == first
    provider.set_ranks("ml", "resnet", {0: RankStatus("ok")})
    r = await client.get("/ui/jobs/ml/resnet/summary")
    assert (await r.json())["revision"] != first
    r = await client.get("/ui/jobs/ml/gone/summary")
    assert (await r.json())["gone"] is True


async def test_trace_json_of_the_timeline_shown(client: TestClient[web.Request, web.Application]) -> None:
    r = await client.get("/ui/jobs/ml/resnet/trace.json", headers={"Accept-Encoding": "gzip"})
    assert r.status == 200 and "attachment" in r.headers["Content-Disposition"]
    assert r.headers["Content-Disposition"].endswith('ml-resnet-trace.json"')
    trace = await r.json()
    slices = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    assert {e["pid"] for e in slices} == {0, 1, 2, 3}
    # the hang: ranks 0, 2, 3 wait in all_reduce #4 until the capture (a long slice), rank 1 never entered it
    waits = [e for e in slices if e["name"] == "all_reduce #4"]
    assert sorted(e["pid"] for e in waits) == [0, 2, 3]
    assert all(e["ph"] == "X" and e["dur"] > 1e6 and e["args"]["in_flight_at_capture"] for e in waits)
    r = await client.get("/ui/jobs/ml/empty/trace.json")  # nothing recorded yet, no live window: 404
    assert r.status == 404
    r = await client.get("/ui/jobs/ml/nope/trace.json")
    assert r.status == 404


async def _next_event(stream: Any) -> dict[str, Any]:
    event: dict[str, str] = {}
    while True:
        line = (await asyncio.wait_for(stream.readline(), 5)).decode().rstrip("\n")
        if line.startswith(":"):
            continue
        if not line:
            if event:
                return {"event": event.get("event"), **json.loads(event["data"])}
            continue
        key, _, value = line.partition(": ")
        event[key] = value


async def test_events_follow_the_provider(
    client: TestClient[web.Request, web.Application], provider: MemoryProvider
) -> None:
    r = await client.get("/ui/jobs/ml/resnet/events")
    assert r.headers["Content-Type"].startswith("text/event-stream")
    first = await _next_event(r.content)
    assert first["event"] == "job" and first["healthy"] is False
    report, timeline = real("none")
    provider.put("ml", "resnet", report=report, timeline=timeline)
    second = await _next_event(r.content)
    assert second["revision"] != first["revision"] and second["healthy"] is True
    # nothing changes: only keepalive comments, no event
    line = await asyncio.wait_for(r.content.readline(), 5)
    assert line.startswith(b":")
    r.close()


async def test_async_provider_and_content_revision() -> None:
    report, timeline = real("hang")

    class AsyncProvider:
        def __init__(self) -> None:
            self.detail = JobDetail(JobSummary("a", "b", verdict=report["verdict"], healthy=False), report, timeline)

        async def jobs(self) -> list[JobSummary]:
            return [self.detail.summary]

        async def job(self, namespace: str, name: str) -> JobDetail | None:
            return self.detail if (namespace, name) == ("a", "b") else None

    p = AsyncProvider()
    rev = detail_revision(p.detail)
    assert rev == detail_revision(JobDetail(p.detail.summary, report, timeline))  # content, not identity
    assert rev != detail_revision(JobDetail(p.detail.summary, report, None))
    async with TestClient(TestServer(create_app(p))) as c:
        r = await c.get("/jobs/a/b/data")
        assert (await r.json())["revision"] == rev
        r = await c.get("/api/jobs")
        assert (await r.json())["jobs"][0]["name"] == "b"


async def test_untrusted_text_is_escaped(provider: MemoryProvider) -> None:
    report, timeline = real("hang")
    report = dict(report, verdict="</script><script>alert(1)</script>")
    provider.put("ml", "evil", report=report, timeline=timeline)
    app = create_app(provider)
    async with TestClient(TestServer(app)) as c:
        for path in ("/", "/jobs/ml/evil"):
            text = await (await c.get(path)).text()
            assert "<script>alert(1)" not in text
