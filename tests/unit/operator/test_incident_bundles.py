"""Each incident's evidence kept as one bundle (`evidence.incident_bundles`): a real gloo hang diagnosed through
the operator's own path (the test_ui rig: controller, status poller, stand-in sidecars serving REAL recorder
snapshots), its bundle downloaded from the web UI and diagnosed again by `frscope analyze BUNDLE`."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import time
from pathlib import Path

import aiohttp
import pytest

from frscope.analysis import AnalysisOptions, analyze
from frscope.cli import main
from frscope.operator.evidence.diagnosis import Diagnosis
from frscope.operator.evidence.incident_bundles import IncidentBundles
from frscope.operator.model.objects import JobRef
from frscope.operator.model.store import LatestDiagnosis
from frscope.operator.serve.ui import OperatorJobs
from frscope.records import load_dumps
from frscope.records.bundle import BUNDLE_SCHEMA
from frscope.report import report_to_dict
from tests.unit.operator.test_ui import CONFIG, Rig

REAL = Path(__file__).resolve().parents[2] / "data" / "real"


async def test_an_incidents_bundle_downloads_and_diagnoses_again(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bundles = IncidentBundles(tmp_path / "bundles")
    rig = await Rig().start(bundles=bundles)
    try:
        async with aiohttp.ClientSession() as http:
            page = f"http://127.0.0.1:{rig.port}/ui/jobs/ml/train"
            async with http.get(f"{page}/bundle") as response:
                assert response.status == 404  # nothing diagnosed yet
            await rig.sweep()
            rig.worker.stalled = True
            await rig.sweep()
            await rig.controller.idle()
            await asyncio.to_thread(bundles.close)  # the writer thread's work done
            detail = OperatorJobs(rig.store).job("ml", "train")
            assert detail is not None and detail.summary.culprit_ranks == (1,)
            async with http.get(page) as response:
                assert 'bundle_url":"train/bundle' in (await response.text()).replace(" ", "")
            async with http.get(f"{page}/bundle") as response:
                assert response.status == 200
                assert ".frscope-bundle.json.gz" in response.headers["Content-Disposition"]
                body = await response.read()
    finally:
        await rig.close()
    bundle = json.loads(gzip.decompress(body))
    assert bundle["schema"] == BUNDLE_SCHEMA and bundle["job"]["name"] == "train"
    assert sorted(w["pod"] for w in bundle["windows"]) == ["train-master-0", "train-worker-0"]
    assert bundle["report"]["findings"] and bundle["timeline"] is not None
    assert any(piece["stacks"] for w in bundle["windows"] for piece in w["ranks"])

    downloaded = tmp_path / "incident.frscope-bundle.json.gz"
    downloaded.write_bytes(body)
    code = main(["analyze", str(downloaded), "--format", "json", "--no-progress",
                 "--stuck-after", str(CONFIG.stuck_after_s)])
    again = json.loads(capsys.readouterr().out)
    assert code == 1
    assert again["findings"][0]["summary"] == detail.summary.verdict
    assert again["findings"][0]["culprit_ranks"] == [1]
    assert again["ranks_loaded"] == [0, 1, 2, 3]


def test_bounded_by_size_count_and_age(tmp_path: Path) -> None:
    bundles = IncidentBundles(tmp_path, max_jobs=2, ttl_s=3600)
    for name in ("a", "b", "c"):
        path = tmp_path / f"ml_{name}.json.gz"
        path.write_bytes(gzip.compress(json.dumps({"schema": BUNDLE_SCHEMA, "job": {},
                                                   "incident": {"id": f"i-{name}"}}).encode()))
        os.utime(path, (time.time() - 10 + ord(name), time.time() - 10 + ord(name)))
    bundles._prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml_b.json.gz", "ml_c.json.gz"]
    assert bundles.kept("ml", "c", "i-c") == tmp_path / "ml_c.json.gz"
    assert bundles.kept("ml", "c", "i-b") is None  # another incident's bundle is never served as this one's
    assert bundles.kept("ml", "../etc", "i-c") is None and bundles.file("ML", "x") is None
    old = time.time() - 7200
    os.utime(tmp_path / "ml_b.json.gz", (old, old))
    (tmp_path / ".ml_c.json.gz.1.tmp").write_bytes(b"half")
    assert bundles.expire() == 1
    assert bundles.kept("ml", "b", "i-b") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml_c.json.gz"]
    (tmp_path / "ml_d.json.gz").write_bytes(b"x" * 500)  # the newest; with c, over the total budget
    os.utime(tmp_path / "ml_d.json.gz", (time.time() + 200, time.time() + 200))
    IncidentBundles(tmp_path, max_total_bytes=550)._prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml_d.json.gz"]


def test_a_bundle_over_the_cap_is_not_kept(tmp_path: Path) -> None:
    dumpset = load_dumps([REAL / "hang"], jobs=1)
    report = analyze(dumpset, AnalysisOptions(stall_after_s=1.0))
    finding = report.findings[0]
    latest = LatestDiagnosis(incident="abc", category=finding.category.value, verdict=finding.summary,
                             culprit_ranks=tuple(finding.culprit_ranks), report_name="train-abc",
                             at="2026-12-04T21:00:00Z", report=report_to_dict(report), timeline=None)
    ref = JobRef("ml", "train", "uid-1")
    IncidentBundles(tmp_path).save(ref, latest, Diagnosis(report, dumpset, {}), {})
    assert IncidentBundles(tmp_path).kept("ml", "train", "abc") is not None
    IncidentBundles(tmp_path, max_bytes=1000).save(ref, latest, Diagnosis(report, dumpset, {}), {})
    assert list(tmp_path.iterdir()) == []  # the older bundle is not left to pass for this incident's
