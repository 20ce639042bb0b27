"""The live window (`serve/live_windows.py`) against stand-in sidecars that serve REAL recorder snapshots
(a real gloo job's, tests/data/real) over real HTTP: what it keeps, when it stops, jobs that go away."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from frscope.operator.evidence.gather import Decoder
from frscope.operator.evidence.pod_evidence import PodEvidence
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.model.objects import JobKey, JobRef, PodInfo
from frscope.operator.model.perf_metrics import PerfMetrics
from frscope.operator.model.store import JobStore
from frscope.operator.serve import live_windows
from frscope.operator.serve.live_windows import LiveWindows
from frscope.operator.serve.ui import OperatorJobs
from tests.unit.operator.fakes import StandInSidecar, real_snapshots

KEY = JobKey("ml", "train")


def _pod(name: str, port: int) -> PodInfo:
    return PodInfo("ml", name, f"uid-{name}", "train", "Worker", 0, "127.0.0.1", port, "Running", 0, (), False)


async def test_window_follows_the_sidecars_and_stops_when_nobody_looks() -> None:
    ranks = real_snapshots("straggler")
    sidecar = await StandInSidecar("train-worker-0", ranks, stalled=False).start()
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=4, conditions=[{"type": "Running"}])
    store.upsert_pod(_pod("train-worker-0", sidecar.port))
    async with aiohttp.ClientSession() as session:
        live = LiveWindows(store, SidecarClient(session), entries=16, interval_s=0.2, linger_s=0.6)
        try:
            ui = OperatorJobs(store, live)
            assert ui.job("ml", "train") is not None  # asking starts the loop
            window = await live.wait_for(KEY, 10)
            assert window is not None and window.timeline is not None and window.failures == {}
            group = next(g for g in window.timeline["groups"] if g["name"] == "0")
            # the newest 16 entries of every rank: the window, with each rank's own times
            assert len(group["seqs"]) <= 16 and group["seqs"][-1] == 20
            assert group["rank_times"]["created_us"] is not None
            assert window.perf is not None and window.perf["costs"][0]["rank"] == 2
            detail = ui.job("ml", "train")
            assert detail is not None and detail.timeline is window.timeline and detail.perf is window.perf
            served = sidecar.snapshot_requests
            await asyncio.sleep(0.7)
            assert sidecar.snapshot_requests > served  # refreshed while looked at
            await asyncio.sleep(1.2)  # nobody asked for linger_s: it stops, the window is let go
            stopped = sidecar.snapshot_requests
            await asyncio.sleep(0.5)
            assert sidecar.snapshot_requests == stopped and live.window(KEY) is None
            # the job goes away: its window too
            ui.job("ml", "train")
            assert await live.wait_for(KEY, 10) is not None
            store.remove_job(KEY)
            await asyncio.sleep(0.5)
            assert live.window(KEY) is None
        finally:
            await live.close()
            await sidecar.close()


async def test_an_unreachable_sidecar_is_a_failure_not_a_crash() -> None:
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=2, conditions=[])
    store.upsert_pod(_pod("train-worker-0", 9))  # nothing listens there
    async with aiohttp.ClientSession() as session:
        live = LiveWindows(store, SidecarClient(session), interval_s=0.2)
        try:
            window = await live.wait_for(KEY, 10)
            assert window is not None and window.timeline is None and "train-worker-0" in window.failures
            assert OperatorJobs(store, live).job("ml", "train") is not None
        finally:
            await live.close()


async def test_the_windows_perf_numbers_are_gauges_while_the_window_is_kept() -> None:
    """The real straggler job's live window: its --perf numbers scraped as the operator serves them (the
    registry's exposition), the straggler (rank 2) first among at most 3 ranks; gone with the window."""
    sidecar = await StandInSidecar("train-worker-0", real_snapshots("straggler"), stalled=False).start()
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=4, conditions=[{"type": "Running"}])
    store.upsert_pod(_pod("train-worker-0", sidecar.port))
    registry = CollectorRegistry()
    metrics = PerfMetrics(registry)

    def scraped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(generate_latest(registry).decode())
                for s in family.samples if s.name.startswith("frscope_operator_job_perf_")}

    async with aiohttp.ClientSession() as session:
        live = LiveWindows(store, SidecarClient(session), entries=16, interval_s=0.2, linger_s=0.6, metrics=metrics)
        try:
            OperatorJobs(store, live).job("ml", "train")
            window = await live.wait_for(KEY, 10)
            assert window is not None and window.perf is not None
            got = scraped()
            job = (("namespace", "ml"), ("training_job", "train"))
            ranks = {dict(labels)["rank"]: value for (name, labels), value in got.items()
                     if name == "frscope_operator_job_perf_rank_cost_seconds"}
            assert 0 < len(ranks) <= 3 and max(ranks, key=ranks.__getitem__) == "2"
            assert got[("frscope_operator_job_perf_window_seconds", job)] > 0
            assert got[("frscope_operator_job_perf_collective_seconds", (*job[:1], ("part", "wait"), job[1]))] > 0
            await asyncio.sleep(2.0)  # nobody looks: the window goes, and its series with it
            assert live.window(KEY) is None and scraped() == {}
        finally:
            await live.close()
            await sidecar.close()


async def test_a_pods_answer_keeps_at_most_the_ranks_per_pod_and_one_refresh_runs_at_a_time() -> None:
    """Issue 34: one pod answering 1,024 ranks with the page open took the operator to 2 GiB, a refresh
    starting while the last one still decoded. A pod's answer keeps `ranks_per_pod` ranks (the rest is a
    named warning), and a second refresh of the job while one is under way asks no sidecar."""
    ranks = real_snapshots("straggler")
    sidecar = await StandInSidecar("train-worker-0", ranks, stalled=False).start()
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=4, conditions=[{"type": "Running"}])
    store.upsert_pod(_pod("train-worker-0", sidecar.port))
    async with aiohttp.ClientSession() as session:
        live = LiveWindows(store, SidecarClient(session), entries=16, interval_s=60, ranks_per_pod=2)
        try:
            first, second = await asyncio.gather(live.refresh(KEY), live.refresh(KEY))
            assert sidecar.snapshot_requests == 1
            assert first is not None and second is None  # the second found the first under way, no window yet
            assert first.timeline is not None and first.timeline["ranks_loaded"] == [0, 1]
        finally:
            await live.close()
            await sidecar.close()


async def test_an_answer_with_the_same_bytes_is_not_decoded_again_and_a_new_one_is() -> None:
    """A sidecar serves what it read at its last full poll (every 30 s by default) to every refresh (1 s):
    while no pod's answer changed, the window is the one made last time (no decode, no timeline, no
    perf); the answer that changes is decoded and drawn. (A sidecar that gives no ETag: the bytes compared.)"""
    ranks = real_snapshots("straggler")
    sidecar = await StandInSidecar("train-worker-0", ranks, stalled=False, etags="none").start()
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=4, conditions=[{"type": "Running"}])
    store.upsert_pod(_pod("train-worker-0", sidecar.port))
    async with aiohttp.ClientSession() as session:
        live = LiveWindows(store, SidecarClient(session), entries=16, interval_s=60)
        try:
            first = await live.refresh(KEY)
            again = await live.refresh(KEY)
            assert sidecar.snapshot_requests == 2 and live.rebuilt == 1  # asked again, nothing rebuilt
            assert first is not None and again is not None and first.timeline is not None
            assert again.timeline is first.timeline and again.perf is first.perf and again.at >= first.at
            # the sidecar's next full poll: rank 0 has recorded one collective more than the others
            piece = ranks[0]
            entries = piece["trace"]["entries"]
            newest = dict(entries[-1], record_id=entries[-1]["record_id"] + 1,
                          collective_seq_id=entries[-1]["collective_seq_id"] + 1)
            piece["trace"] = dict(piece["trace"], entries=[*entries, newest])
            changed = await live.refresh(KEY)
            assert live.rebuilt == 2 and changed is not None and changed.timeline is not None
            assert changed.timeline is not first.timeline and changed.fingerprint != first.fingerprint
            group = next(g for g in changed.timeline["groups"] if g["name"] == "0")
            assert group["seqs"][-1] == newest["collective_seq_id"]
        finally:
            await live.close()
            await sidecar.close()


class CountingDecoder(Decoder):
    """The operator's decoder (in-process threads), counting the answers it is handed."""

    def __init__(self) -> None:
        super().__init__(0)
        self.decoded = 0

    async def decode_file(self, path: str, endpoint: str, **kw: Any) -> PodEvidence:
        self.decoded += 1
        return await super().decode_file(path, endpoint, **kw)


async def test_a_sidecar_that_says_not_modified_is_neither_fetched_nor_decoded_again() -> None:
    """Conditional requests: each refresh sends the ETag the pod's sidecar gave for the answer kept; its 304
    keeps that answer and the window (no body, no decode, no timeline). The sidecar's next full poll
    changes its ETag: that answer is fetched, decoded and drawn."""
    ranks = real_snapshots("straggler")
    sidecar = await StandInSidecar("train-worker-0", ranks, stalled=False).start()
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=4, conditions=[{"type": "Running"}])
    store.upsert_pod(_pod("train-worker-0", sidecar.port))
    decoder = CountingDecoder()
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        live = LiveWindows(store, SidecarClient(session), entries=16, interval_s=60, decoder=decoder)
        try:
            first = await live.refresh(KEY)
            assert first is not None and first.timeline is not None and decoder.decoded == 1
            etag = sidecar._etag(False)
            assert etag is not None and sidecar.if_none_match == [None]
            for _ in range(2):
                again = await live.refresh(KEY)
                assert again is not None and again.timeline is first.timeline and again.perf is first.perf
            assert sidecar.if_none_match == [None, etag, etag] and decoder.decoded == 1 and live.rebuilt == 1
            # the sidecar's next full poll: rank 0 has recorded one collective more
            entries = ranks[0]["trace"]["entries"]
            newest = dict(entries[-1], record_id=entries[-1]["record_id"] + 1,
                          collective_seq_id=entries[-1]["collective_seq_id"] + 1)
            ranks[0]["trace"] = dict(ranks[0]["trace"], entries=[*entries, newest])
            changed = await live.refresh(KEY)
            assert changed is not None and changed.timeline is not None and decoder.decoded == 2
            assert live.rebuilt == 2 and changed.fingerprint != first.fingerprint
            assert next(g for g in changed.timeline["groups"] if g["name"] == "0")["seqs"][-1] == newest[
                "collective_seq_id"]
            await live.refresh(KEY)
            assert sidecar.if_none_match[-1] == sidecar._etag(False) != etag and decoder.decoded == 2
        finally:
            await live.close()
            await sidecar.close()


async def test_hostile_etags_are_never_sent_back_and_an_unasked_304_is_a_failure() -> None:
    """An ETag past the bounds or not an entity tag is not kept (the next request is not conditional: the
    bytes are compared instead); a 304 to a request that named no ETag is the pod's failure, named; an
    ETag goes back to the sidecar that gave it only, not to the next pod of the same name."""
    ranks = real_snapshots("straggler")
    huge = await StandInSidecar("train-worker-0", ranks, stalled=False, etags="huge").start()
    junk = await StandInSidecar("train-worker-1", ranks, stalled=False, etags="junk").start()
    lying = await StandInSidecar("train-worker-2", ranks, stalled=False, etags="always-304").start()
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=4, conditions=[{"type": "Running"}])
    for sidecar in (huge, junk, lying):
        store.upsert_pod(_pod(sidecar.pod, sidecar.port))
    decoder = CountingDecoder()
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        live = LiveWindows(store, SidecarClient(session), entries=16, interval_s=60, decoder=decoder)
        try:
            for _ in range(2):
                window = await live.refresh(KEY)
                assert window is not None and window.timeline is not None
                assert window.pods == 2 and "304 Not Modified" in window.failures["train-worker-2"]
            assert huge.if_none_match == junk.if_none_match == [None, None] and decoder.decoded == 4
            assert live.rebuilt == 1  # the same bytes: kept all the same
            # a pod of the same name, another uid and sidecar: the first's ETag is not shown to it
            ok = await StandInSidecar("train-worker-0", ranks, stalled=False).start()
            store.upsert_pod(PodInfo("ml", "train-worker-0", "uid-other", "train", "Worker", 0, "127.0.0.1",
                                     ok.port, "Running", 0, (), False))
            await live.refresh(KEY)
            await live.refresh(KEY)
            assert ok.if_none_match == [None, ok._etag(False)]
            await ok.close()
        finally:
            await live.close()
            for sidecar in (huge, junk, lying):
                await sidecar.close()


async def test_past_the_kept_bytes_a_job_is_decoded_whole_every_refresh(monkeypatch: Any) -> None:
    monkeypatch.setattr(live_windows, "MAX_KEPT_BYTES", 1)
    ranks = real_snapshots("straggler")
    sidecar = await StandInSidecar("train-worker-0", ranks, stalled=False).start()
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=4, conditions=[{"type": "Running"}])
    store.upsert_pod(_pod("train-worker-0", sidecar.port))
    async with aiohttp.ClientSession() as session:
        live = LiveWindows(store, SidecarClient(session), entries=16, interval_s=60)
        try:
            first, again = await live.refresh(KEY), await live.refresh(KEY)
            assert live.rebuilt == 2 and first is not None and again is not None
            assert again.timeline is not first.timeline and again.fingerprint == first.fingerprint
        finally:
            await live.close()
            await sidecar.close()


async def test_a_pod_not_decoded_in_time_keeps_its_last_answer_for_a_while(monkeypatch: Any) -> None:
    """Every pod's full poll lands at once: on a busy operator not every answer is decoded before the
    refresh's deadline. A pod decoded before keeps its last evidence meanwhile (no flicker to 'failed'),
    the window stays the one drawn until its answer is in; a sidecar that stays away is then a failure."""
    monkeypatch.setattr(live_windows, "CARRY_REFRESHES", 2)
    ranks = real_snapshots("straggler")
    sidecar = await StandInSidecar("train-worker-0", ranks, stalled=False).start()
    store = JobStore()
    store.upsert_job(JobRef("ml", "train", "uid"), world_size=4, conditions=[{"type": "Running"}])
    store.upsert_pod(_pod("train-worker-0", sidecar.port))
    async with aiohttp.ClientSession() as session:
        live = LiveWindows(store, SidecarClient(session), entries=16, interval_s=0.2)
        try:
            first = await live.refresh(KEY)
            assert first is not None and first.timeline is not None and first.failures == {}
            sidecar.mode, sidecar.delay_s = "slow", 3.0  # past the refresh's deadline (3 intervals)
            for _ in range(2):
                held = await live.refresh(KEY)
                assert held is first and live.rebuilt == 1
            gone = await live.refresh(KEY)
            assert gone is not None and "train-worker-0" in gone.failures and live.rebuilt == 2
            sidecar.mode = "ok"
            back = await live.refresh(KEY)
            assert back is not None and back.failures == {} and back.timeline is not None
            spool = live._spool
            assert spool is not None and spool.is_dir()
        finally:
            await live.close()
            await sidecar.close()
        assert not spool.exists()  # the answers' folder goes with the windows
