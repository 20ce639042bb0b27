"""A past incident's page after an operator restart, in a real Chromium: the view of a real gloo hang
(tests/data/real/hang) kept by the incident archive, read back by a fresh store, served by the web UI."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from frscope.analysis import AnalysisOptions, analyze
from frscope.operator.evidence.diagnosis import Diagnosis
from frscope.operator.evidence.incident_archive import IncidentArchive
from frscope.operator.evidence.incident_bundles import IncidentBundles
from frscope.operator.model.objects import JobRef
from frscope.operator.model.store import JobStore, LatestDiagnosis
from frscope.operator.serve.ui import OperatorJobs
from frscope.records import load_dumps
from frscope.records.bundle import BUNDLE_SCHEMA
from frscope.report import report_to_dict
from frscope.report.timeline import build_timeline
from frscope.webui import create_app
from tests.browser.conftest import LiveServer, PageErrors, state, wait_ready

REAL = Path(__file__).parents[1] / "data" / "real"
pytestmark = pytest.mark.browser


def test_past_incident_renders_after_a_restart(browser: Any, tmp_path: Path, artifacts: Path) -> None:
    dumpset = load_dumps([REAL / "hang"])
    report = analyze(dumpset, AnalysisOptions(stall_after_s=1.0))
    finding = report.findings[0]
    kept = LatestDiagnosis(
        incident="abc", category=finding.category.value, verdict=finding.summary,
        culprit_ranks=tuple(finding.culprit_ranks), report_name="train-abc", at="2026-12-04T21:00:00Z",
        report=report_to_dict(report), timeline=build_timeline(dumpset, report))
    IncidentArchive(tmp_path).save(JobRef("ml", "train", "uid-1"), kept)
    bundles = IncidentBundles(tmp_path / "bundles")
    bundles.save(JobRef("ml", "train", "uid-1"), kept, Diagnosis(report, dumpset, {}), {})
    store = JobStore()  # the restarted operator
    for ref, latest in IncidentArchive(tmp_path).load():
        store.restore(ref, latest)
    with LiveServer(create_app(OperatorJobs(store, None, IncidentBundles(tmp_path / "bundles")),
                               poll_s=0.2)) as server:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        errors = PageErrors(page)
        try:
            page.goto(server.url("/"))
            wait_ready(page)
            assert "archived" in page.inner_text("#jobs-body")
            page.click("text=ml/train")
            wait_ready(page)
            s = state(page)
            assert s["highlightedRanks"] == [1] and s["stuckVisible"] and "1" in s["verdict"]
            page.screenshot(path=str(artifacts / "incident-after-restart.png"), full_page=True)
            # the past incident's bundle: linked from the page, downloadable, the evidence frscope analyze reads
            assert page.is_visible("#fr-bundle")
            download = page.request.get(server.url("/jobs/ml/") + str(page.get_attribute("#fr-bundle", "href")))
            assert download.ok and "frscope-bundle.json.gz" in download.headers["content-disposition"]
            bundle = json.loads(gzip.decompress(download.body()))
            assert bundle["schema"] == BUNDLE_SCHEMA and bundle["incident"]["id"] == "abc"
            assert errors.items == []
        finally:
            context.close()
