"""Incident views kept across an operator restart (`evidence.incident_archive`, `JobStore.restore`): a real
gloo hang diagnosed through the operator's own path (the test_ui rig: controller, status poller, stand-in
sidecars serving REAL recorder snapshots), kept on disk, then read back by a fresh store as after a restart."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

from frscope.operator.evidence.incident_archive import SCHEMA, IncidentArchive
from frscope.operator.model.objects import JobRef
from frscope.operator.model.store import JobStore, LatestDiagnosis
from frscope.operator.serve.ui import OperatorJobs
from tests.unit.operator import builders
from tests.unit.operator.test_ui import Rig


async def test_a_diagnosed_incident_renders_after_a_restart(tmp_path: Path) -> None:
    archive = IncidentArchive(tmp_path / "incidents")
    rig = await Rig().start(store=JobStore(on_latest=archive.save))
    try:
        await rig.sweep()
        rig.worker.stalled = True
        await rig.sweep()
        await rig.controller.idle()
        before = OperatorJobs(rig.store).job("ml", "train")
        assert before is not None and before.timeline is not None and before.summary.culprit_ranks == (1,)
    finally:
        await rig.close()
    assert [p.name for p in (tmp_path / "incidents").iterdir()] == ["ml_train.json.gz"]

    # the operator restarts: a new store, the kept views read back
    store = JobStore()
    for ref, latest in IncidentArchive(tmp_path / "incidents").load():
        store.restore(ref, latest)
    ui = OperatorJobs(store)
    [listed] = ui.jobs()
    assert listed.verdict == before.summary.verdict and listed.culprit_ranks == (1,) and "archived" in listed.state
    after = ui.job("ml", "train")
    assert after is not None and after.timeline == before.timeline and after.report == before.report
    assert after.timeline is not None and after.timeline["culprit_ranks"] == [1]

    # kopf replays the job (same uid): the view becomes the job's latest diagnosis, no longer archived
    ref = JobRef("ml", "train", builders.job()["metadata"]["uid"])
    store.upsert_job(ref, world_size=4, conditions=[{"type": "Running", "status": "True"}])
    [live] = ui.jobs()
    assert "archived" not in live.state and live.verdict == before.summary.verdict
    # a new job of that name (another uid) does not inherit it
    store2 = JobStore()
    for kept_ref, latest in IncidentArchive(tmp_path / "incidents").load():
        store2.restore(kept_ref, latest)
    store2.upsert_job(JobRef("ml", "train", "another-uid"), world_size=4, conditions=[])
    [fresh] = OperatorJobs(store2).jobs()
    assert fresh.verdict is None


def _latest(i: int = 0) -> LatestDiagnosis:
    return LatestDiagnosis(incident=f"inc-{i}", category="RankNotJoined", verdict="Rank 1 never joined.",
                           culprit_ranks=(1,), report_name=f"r-{i}", at="2026-12-04T21:00:00Z",
                           report={"verdict": "Rank 1 never joined.", "world_size": 4}, timeline=None)


def test_hostile_or_stale_files_are_dropped_and_the_rest_load(tmp_path: Path) -> None:
    archive = IncidentArchive(tmp_path, max_bytes=10_000)
    archive.save(JobRef("ml", "good", "u1"), _latest())
    (tmp_path / "ml_garbage.json.gz").write_bytes(b"not gzip at all")
    (tmp_path / "ml_schema.json.gz").write_bytes(gzip.compress(b'{"schema": "something else"}'))
    doc = json.loads(gzip.decompress((tmp_path / "ml_good.json.gz").read_bytes()))
    (tmp_path / "ml_other.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))  # names another job
    bad_ranks = json.loads(json.dumps(doc))
    bad_ranks["ref"]["name"] = "ranks"
    bad_ranks["latest"]["culprit_ranks"] = ["1"]
    (tmp_path / "ml_ranks.json.gz").write_bytes(gzip.compress(json.dumps(bad_ranks).encode()))
    big = json.loads(json.dumps(doc))
    big["ref"]["name"] = "big"
    big["latest"]["report"]["pad"] = "x" * 20_000
    (tmp_path / "ml_big.json.gz").write_bytes(gzip.compress(json.dumps(big).encode()))
    old = json.loads(json.dumps(doc))
    old["ref"]["name"] = "old"
    (tmp_path / "ml_old.json.gz").write_bytes(gzip.compress(json.dumps(old).encode()))
    os.utime(tmp_path / "ml_old.json.gz", (time.time() - 30 * 86400,) * 2)
    loaded = list(archive.load())
    assert [(r.name, latest.incident) for r, latest in loaded] == [("good", "inc-0")]
    assert doc["schema"] == SCHEMA
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml_good.json.gz"]


def test_bounded_by_job_count_and_names_that_are_no_kubernetes_names_are_not_kept(tmp_path: Path) -> None:
    archive = IncidentArchive(tmp_path, max_jobs=3)
    for i in range(5):
        archive.save(JobRef("ml", f"job-{i}", "u"), _latest(i))
        os.utime(tmp_path / f"ml_job-{i}.json.gz", (time.time() - 100 + i,) * 2)
    archive.save(JobRef("ml", "job-5", "u"), _latest(5))
    assert len(list(tmp_path.iterdir())) == 3
    archive.save(JobRef("../etc", "x", "u"), _latest())
    archive.save(JobRef("ml", "a_b", "u"), _latest())
    assert len(list(tmp_path.iterdir())) == 3
    archive.save_soon(JobRef("ml", "later", "u"), _latest(9))
    archive.close()
    assert (tmp_path / "ml_later.json.gz").exists()
