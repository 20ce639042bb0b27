"""The poll schedule (frscope.sidecar.schedule): every pod of a job picks the same wall-clock slots, at a
phase drawn from the job's identity, the periodic full read on the same slot everywhere; a suspected
stall is still read at once, off the periodic slot."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import pytest

from frscope.operator import names
from frscope.operator.injection import InjectionConfig, inject, schedule_key
from frscope.sidecar.config import SidecarConfig
from frscope.sidecar.schedule import next_slot, phase_s
from tests.unit.sidecar.test_probe import fetches, sidecar, worker

INTERVAL, EVERY = 10.0, 6
PERIOD = INTERVAL * EVERY
PHASE_ML_TRAIN = 3.423341311377866  # phase_s("ml/train", 10, 6)


def test_the_phase_is_the_jobs_own_and_the_same_in_every_pod() -> None:
    key = "ml/llama-70b"
    assert phase_s(key, INTERVAL, EVERY) == phase_s(key, INTERVAL, EVERY)  # deterministic, nothing random
    assert phase_s("", INTERVAL, EVERY) == 0.0  # no key: the epoch's multiples, as before
    phases = [phase_s(f"ns/job-{i}", INTERVAL, EVERY) for i in range(2000)]
    assert all(0.0 <= p < PERIOD for p in phases)
    # Spread over the whole period: two jobs on a node rarely read in the same moment.
    assert min(phases) < 1.0 and max(phases) > PERIOD - 1.0
    assert abs(sum(phases) / len(phases) - PERIOD / 2) < 2.0
    # Not Python's hash() (salted per process): a sha256 of the key, the same in every pod and version.
    assert phase_s("ml/train", INTERVAL, EVERY) == pytest.approx(PHASE_ML_TRAIN, abs=1e-9)


def test_every_pod_of_a_job_picks_the_same_slots_in_the_window() -> None:
    """Sidecars that started at any moment, with clocks a few ms apart, wait for the same slots: the
    periodic one is the same instant for all, every PERIOD, at the job's phase."""
    rng = random.Random(15)
    phase = phase_s("ml/train", INTERVAL, EVERY)
    for _ in range(200):
        now = 1_800_000_000 + rng.uniform(0, 10 * PERIOD)
        pods = [now + rng.uniform(-0.004, 0.004) for _ in range(50)]  # NTP: clocks within milliseconds
        slots = [next_slot(t, INTERVAL, EVERY, phase) for t in pods]
        slot = slots[0]
        if min(abs((t - phase) / INTERVAL - round((t - phase) / INTERVAL)) for t in pods) * INTERVAL < 0.01:
            continue  # a pod's clock sits on the slot itself: it may take the next one (strictly after)
        assert {s.index for s in slots} == {slot.index} and {s.periodic for s in slots} == {slot.periodic}
        assert {round(s.at_s, 6) for s in slots} == {round(slot.at_s, 6)}
        assert now - 0.01 < slot.at_s <= now + INTERVAL + 0.01  # the next slot, within one interval
        assert math.isclose((slot.at_s - phase) / INTERVAL, slot.index, abs_tol=1e-6)
        for s, t in zip(slots, pods, strict=True):
            assert s.wait_s == pytest.approx(s.at_s - t)
    # The periodic slots of a job: once every PERIOD, at phase + k x PERIOD.
    t, periodic = 1_800_000_000.0, []
    while len(periodic) < 5:
        s = next_slot(t, INTERVAL, EVERY, phase)
        if s.periodic:
            periodic.append(s.at_s)
        t = s.at_s
    assert all(b - a == pytest.approx(PERIOD) for a, b in zip(periodic, periodic[1:], strict=False))
    assert all(((p - phase) / PERIOD) == pytest.approx(round((p - phase) / PERIOD)) for p in periodic)


def test_two_jobs_read_at_their_own_moments() -> None:
    a, b = phase_s("ml/a", INTERVAL, EVERY), phase_s("ml/b", INTERVAL, EVERY)
    sa = next_slot(1_800_000_000.0, INTERVAL, EVERY, a)
    sb = next_slot(1_800_000_000.0, INTERVAL, EVERY, b)
    assert sa.at_s != sb.at_s


def test_the_webhook_gives_every_pod_of_a_job_the_same_key() -> None:
    def pod(job: str, index: int, ns: str = "ml") -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": f"{job}-worker-", "namespace": ns, "labels": {
                    names.LABEL_JOB_NAME: job, "training.kubeflow.org/replica-index": str(index),
                    names.INJECT_KEY: "true"}},
                "spec": {"containers": [{"name": "pytorch", "image": "trainer:1"}]}}

    def key_arg(p: dict[str, object]) -> list[str]:
        out = inject(p, InjectionConfig())
        assert out is not None
        [sc] = out["spec"]["initContainers"]
        return [a for a in sc["args"] if a.startswith("--schedule-key=")]

    assert key_arg(pod("train", 0)) == key_arg(pod("train", 7)) == ["--schedule-key=ml/train"]
    assert key_arg(pod("other", 0)) == ["--schedule-key=ml/other"]
    assert key_arg(pod("train", 0, ns="team-b")) == ["--schedule-key=team-b/train"]
    jobset_pod = {"metadata": {"namespace": "ml", "labels": {"jobset.sigs.k8s.io/jobset-name": "tj"}}}
    assert schedule_key(jobset_pod) == "ml/tj"
    no_job = pod("x", 0)
    no_job["metadata"]["labels"].pop(names.LABEL_JOB_NAME)  # type: ignore[index]
    assert schedule_key(no_job) is None and key_arg(no_job) == []


def test_the_key_is_one_option_with_its_variable() -> None:
    import argparse

    from frscope.sidecar.config import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert SidecarConfig().schedule_key == ""
    assert config_from_args(parser.parse_args(["--schedule-key", "ml/a"])).schedule_key == "ml/a"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRSCOPE_SCHEDULE_KEY", "ml/b")
        assert config_from_args(parser.parse_args([])).schedule_key == "ml/b"
        mp.delenv("FRSCOPE_SCHEDULE_KEY")
        assert config_from_args(parser.parse_args([])).schedule_key == ""


async def test_a_suspected_stall_is_read_at_once_off_the_periodic_slot(tmp_path: Path) -> None:
    """Rounds between periodic slots ask the probe only; the round that sees a collective in flight
    and no progress since the previous one reads the full recorder then, not at the next periodic slot."""
    async with worker(tmp_path) as w:
        sc = sidecar(tmp_path, full_poll_every=1000)
        w.done = 5
        await sc.poll_once()  # first sight
        for _ in range(3):
            w.done += 1
            await sc.poll_once(periodic=False)
        before = w.full
        w.hung, w.hung_at_ns = True, time.time_ns()
        await sc.poll_once(periodic=False)  # the probe moved (the hung op's enqueue): no read
        assert w.full == before
        await sc.poll_once(periodic=False)  # in flight, unchanged: read now
        assert w.full == before + 1 and fetches(sc, "suspect") == 1 and fetches(sc, "periodic") == 0
        for state in sc.ranks.values():
            await state.client.close()
