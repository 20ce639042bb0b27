"""`--evidence-dir`: accepted pushes survive an operator restart; names from the push never become
arbitrary paths; a damaged file is dropped, not fatal. Real HTTP on loopback, a real directory."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.evidence.push_store import PushStore
from frscope.operator.evidence.spill import EvidenceDir
from frscope.operator.kube import StaticToken
from frscope.operator.model.objects import JobKey
from frscope.operator.model.operator_metrics import OperatorMetrics
from frscope.operator.serve.access import SharedTokenPush
from frscope.operator.serve.operator_http import Health, OperatorHttp
from tests.unit.operator.fakes import StandInSidecar

TTL = 3600.0


def snapshot(pod: str, ranks: dict[int, dict[str, object]]) -> bytes:
    return gzip.compress(json.dumps(StandInSidecar(pod, ranks).snapshot_obj() | {"reason": "stall"}).encode())


async def push_all(spill: EvidenceDir, pushes: PushStore, bodies: dict[str, bytes]) -> list[int]:
    def on_push(evidence: PodEvidence) -> JobKey | None:
        pushes.put(evidence, job="train")
        return JobKey("ml", "train")

    http = OperatorHttp(registry=CollectorRegistry(), metrics=OperatorMetrics(CollectorRegistry()),
                        health=Health(max_silence_s=60), on_push=on_push,
                        push_auth=SharedTokenPush(StaticToken("s3cret")), spill=spill)
    port = await http.start("127.0.0.1", 0)
    statuses = []
    try:
        async with aiohttp.ClientSession() as s:
            for pod, body in bodies.items():
                headers = {"Authorization": "Bearer s3cret", "Content-Encoding": "gzip",
                           "X-Frscope-Pod": pod, "X-Frscope-Namespace": "ml"}
                async with s.post(f"http://127.0.0.1:{port}/v1/push", data=body, headers=headers) as r:
                    statuses.append(r.status)
    finally:
        await http.stop()
    return statuses


async def test_accepted_pushes_survive_a_restart(tmp_path: Path, hang_ranks: dict[int, dict[str, object]]) -> None:
    before = PushStore(max_bytes=10**9)
    spill = EvidenceDir(tmp_path / "evidence")
    bodies = {"train-worker-0": snapshot("train-worker-0", {0: hang_ranks[0]}),
              "train-worker-1": snapshot("train-worker-1", {1: hang_ranks[1]}),
              "Not_A..Name": snapshot("x", {2: hang_ranks[2]})}
    assert await push_all(spill, before, bodies) == [202, 202, 202]
    # the operator restarts: a new store, filled from the directory
    after = PushStore(max_bytes=10**9)
    for kept in EvidenceDir(tmp_path / "evidence").load(max_entries=200, ttl_s=TTL):
        after.put(kept)
    assert set(after.for_namespace_pods("ml", {"train-worker-0", "train-worker-1"})) == {
        "train-worker-0", "train-worker-1"}
    for pod in ("train-worker-0", "train-worker-1"):
        was, now = before.get("ml", pod), after.get("ml", pod)
        assert was is not None and now is not None
        assert now.ranks == was.ranks and [len(d.entries) for d in now.dumps] == [len(d.entries) for d in was.dumps]
    # the pod name that is no Kubernetes name was accepted in memory, but never became a path
    assert sorted(p.name for p in (tmp_path / "evidence").iterdir() if p.name != ".incoming") == [
        "ml_train-worker-0.json.gz", "ml_train-worker-1.json.gz"]


def test_a_damaged_or_foreign_file_is_dropped_and_the_rest_loads(
        tmp_path: Path, hang_ranks: dict[int, dict[str, object]]) -> None:
    spill = EvidenceDir(tmp_path)
    spill.save("ml", "good", snapshot("good", {0: hang_ranks[0]}))
    (tmp_path / "ml_broken.json.gz").write_bytes(gzip.compress(b"{not json"))
    (tmp_path / "ml_Bad..Name.json.gz").write_bytes(snapshot("x", {0: hang_ranks[0]}))
    loaded = list(spill.load(max_entries=200, ttl_s=TTL))
    assert [(e.namespace, e.pod, e.ranks) for e in loaded] == [("ml", "good", (0,))]
    assert [p.name for p in tmp_path.iterdir()] == ["ml_good.json.gz"]


def test_an_evicted_push_leaves_the_directory_too(tmp_path: Path, hang_ranks: dict[int, dict[str, object]]) -> None:
    spill = EvidenceDir(tmp_path)
    store: PushStore | None = None
    for pod in ("a", "b"):  # same-sized bodies; room for one and a half
        spill.save("ml", pod, snapshot(pod, {0: hang_ranks[0]}))
        for kept in EvidenceDir(tmp_path).load(max_entries=200, ttl_s=TTL):
            if kept.pod == pod:
                store = store or PushStore(max_bytes=kept.held_bytes * 3 // 2, hold_s=0, on_drop=spill.remove)
                store.put(kept)
    assert store is not None
    assert store.get("ml", "a") is None and [p.name for p in tmp_path.iterdir()] == ["ml_b.json.gz"]


def test_the_pushing_pods_uid_survives_a_restart(tmp_path: Path, hang_ranks: dict[int, dict[str, object]]) -> None:
    """A job's pods keep their names across a restart: the uid the push's token named is kept with the
    body, so after an operator restart a gone pod's push is still told from its successor's."""
    spill = EvidenceDir(tmp_path)
    old_uid, new_uid = "0b6f2c1e-1111-4a5b-9c3d-000000000001", "0b6f2c1e-2222-4a5b-9c3d-000000000002"
    spill.save("ml", "train-worker-0", snapshot("train-worker-0", {0: hang_ranks[0]}), old_uid)
    [kept] = EvidenceDir(tmp_path).load(max_entries=200, ttl_s=TTL)
    assert (kept.pod, kept.pod_uid) == ("train-worker-0", old_uid)
    # the successor of the same name pushes: its body replaces the gone pod's, file and uid
    spill.save("ml", "train-worker-0", snapshot("train-worker-0", {1: hang_ranks[1]}), new_uid)
    [kept] = EvidenceDir(tmp_path).load(max_entries=200, ttl_s=TTL)
    assert (kept.pod_uid, kept.ranks) == (new_uid, (1,))
    assert [p.name for p in tmp_path.iterdir()] == [f"ml_train-worker-0_{new_uid}.json.gz"]
    # a uid that is no uid never becomes part of a path; removing the pod removes whatever uid it had
    spill.save("ml", "train-worker-1", snapshot("train-worker-1", {2: hang_ranks[2]}), "../../etc")
    assert [p.name for p in tmp_path.iterdir()] == [f"ml_train-worker-0_{new_uid}.json.gz"]
    spill.remove("ml", "train-worker-0")
    assert list(tmp_path.iterdir()) == []
