"""The sidecar's watch for hangs the recorder cannot see (frscope.sidecar.unrecorded), stepped poll by
poll: the usual step from the recorders' enqueue times, stacks asked only past it, a suspicion only
when a rank waits in the same torch.distributed call at two rounds running, its end when the recorder
or the stacks move, the confirmation at --stall-after, and the back-off for pauses in Python. The real
worker servers are tests/integration/test_sidecar_unrecorded.py's; here a Poller whose
`fetch_stacks` hands out scripted stacks stands in for them, so that time can be stepped exactly."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from frscope.sidecar.client import WorkerClient
from frscope.sidecar.config import SidecarConfig
from frscope.sidecar.metrics import SidecarMetrics
from frscope.sidecar.poller import Poller
from frscope.sidecar.progress import StallTracker
from frscope.sidecar.ranks import RankState
from frscope.sidecar.unrecorded import UnrecordedWatch, rank_wait, usual_step_s
from tests.unit.builders import T0
from tests.unit.sidecar.test_progress import gloo, samples
from tests.unit.test_unrecorded_waits import BARRIER, IN_PYTHON

S = 1_000_000_000
POLL = 2 * S


class ScriptedPoller(Poller):
    """The poller with its ranks' stacks handed out by the test (no worker server)."""

    def __init__(self, config: SidecarConfig, tracker: StallTracker) -> None:
        super().__init__(config, tracker, SidecarMetrics(CollectorRegistry()))
        self.script: dict[int, str] = {}
        self.asked = 0

    async def fetch_stacks(self) -> list[int]:
        self.asked += 1
        for rank, state in self.ranks.items():
            state.stacks = self.script.get(rank)
        return sorted(self.ranks)


def setup(ranks: int = 3, stall_after_s: float = 60.0) -> tuple[ScriptedPoller, UnrecordedWatch]:
    cfg = SidecarConfig(socket_dir=Path("/nonexistent"))
    poller = ScriptedPoller(cfg, StallTracker(stall_after_s, 0.5, suspect_after_s=15.0, suspect_min_s=4.0))
    for rank in range(ranks):
        client = WorkerClient(Path("/nonexistent"), timeout_s=1.0, max_bytes=1 << 20)
        state = RankState(rank, Path(f"/nonexistent/rank-{rank}.sock"), client)
        state.up = True
        poller.ranks[rank] = state
    return poller, UnrecordedWatch(4.0, 15.0, stall_after_s, 2.0)


def poll(poller: ScriptedPoller, watch: UnrecordedWatch, done: int, now: int, prev: int | None) -> str | None:
    """One round: every rank's recorder shows `done` retired all_reduces, 0.2 s apart up to T0 + 10 s."""
    created = {seq: T0 + 10 * S - (done - seq) * S // 5 for seq in range(1, done + 1)}
    for rank in poller.ranks:
        poller.tracker.update(rank, samples(gloo(done, False, created=created), rank), now, prev)
    return asyncio.run(watch.round(poller, now))


def test_the_usual_step_is_the_upper_gap_between_enqueues_and_sets_the_threshold() -> None:
    steps = {0: [T0 + i * S // 4 for i in range(40)] + [T0 + 40 * S // 4 + 20 * S]}  # one 20 s pause
    assert usual_step_s(steps) == 0.25
    assert usual_step_s({0: [T0]}) == 0.0
    watch = UnrecordedWatch(4.0, 15.0, 60.0, 2.0)
    assert watch.threshold(0.25) == 4.0 and watch.threshold(2.0) == 6.0 and watch.threshold(30.0) == 15.0
    assert UnrecordedWatch(4.0, 0.0, 60.0, 2.0).threshold(30.0) == 60.0  # suspicions off: --stall-after


def test_rank_wait_names_the_call_and_the_users_site() -> None:
    wait = rank_wait(0, BARRIER)
    assert wait is not None and wait.op == "monitored_barrier" and wait.site == "/app/train.py:166 (main)"
    assert rank_wait(1, IN_PYTHON) is None and rank_wait(2, None) is None
    # A deeper thread in Python (a pin-memory thread) beside the one waiting: the waiting one counts.
    pin = "\n".join(f'  File "/app/loader.py", line {i} in pin_loop' for i in range(1, 9))
    both = BARRIER + "\nThread 0x00007f3e00000001 (most recent call first):\n" + pin + "\n"
    found = rank_wait(3, both)
    assert found is not None and found.op == "monitored_barrier"


def test_a_barrier_wait_is_suspected_at_the_second_sample_then_confirmed_then_ends_with_progress() -> None:
    poller, watch = setup()
    poller.script = {0: BARRIER, 1: IN_PYTHON, 2: BARRIER}
    now = T0 + 10 * S
    events: list[tuple[float, str | None]] = []
    prev = None
    while now <= T0 + 80 * S:
        events.append(((now - T0 - 10 * S) / S, poll(poller, watch, 50, now, prev)))
        prev, now = now, now + POLL
    raised = [(t, e) for t, e in events if e]
    assert raised == [(6.0, "suspect"), (60.0, "stall")]  # stacks first asked at 4 s, the same at 6 s
    assert set(watch.blocked) == {0, 2} and watch.stalled and watch.usual_step_s == 0.2
    # The job moves on: the recorder shows a new collective; the confirmed stall ends (no outcome).
    assert poll(poller, watch, 51, now, prev) is None and not watch.suspected and not watch.blocked


def test_a_wait_that_moves_between_samples_is_not_suspected_and_one_that_ends_is_resumed() -> None:
    poller, watch = setup()
    poller.script = {0: BARRIER, 1: IN_PYTHON}
    now, prev = T0 + 10 * S, None
    for _ in range(3):  # 0, 2, 4 s: the first sample at 4 s
        assert poll(poller, watch, 50, now, prev) is None
        prev, now = now, now + POLL
    poller.script = {0: BARRIER.replace("line 166", "line 170"), 1: IN_PYTHON}  # another call site: a new wait
    assert poll(poller, watch, 50, now, prev) is None
    prev, now = now, now + POLL
    assert poll(poller, watch, 50, now, prev) == "suspect"  # the same as the sample before
    prev, now = now, now + POLL
    poller.script = {0: IN_PYTHON, 1: IN_PYTHON}  # the barrier returned (p2p moved, nothing recorded)
    assert poll(poller, watch, 50, now, prev) == "resumed" and not watch.suspected


def test_a_pause_in_python_backs_off_its_stack_samples() -> None:
    poller, watch = setup()
    poller.script = {0: IN_PYTHON, 1: IN_PYTHON, 2: IN_PYTHON}
    now, prev = T0 + 10 * S, None
    while now <= T0 + 10 * S + 300 * S:  # five minutes of evaluation with no collective
        assert poll(poller, watch, 50, now, prev) is None
        prev, now = now, now + POLL
    # at 4, 8, 16, 32, 64, 124, 184, 244 s: twice the quiet time, then every --stall-after
    assert poller.asked == 8 and not watch.suspected
