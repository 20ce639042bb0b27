"""Suspected stalls per (rank, group): raised past the group's own rhythm, never for a pause with
nothing in flight, confirmed at the stall threshold, cleared (resumed) when the group moves on."""

from __future__ import annotations

from frscope.sidecar.progress import StallTracker
from frscope.sidecar.rhythm import RHYTHM_EPISODES, Rhythm
from tests.unit.builders import T0
from tests.unit.sidecar.test_progress import gloo, samples

S = 1_000_000_000
POLL = S // 2


def tracker(**overrides: float) -> StallTracker:
    values = {"stall_after_s": 60.0, "timeout_fraction": 0.5, "suspect_after_s": 15.0, "suspect_min_s": 4.0}
    values.update(overrides)
    return StallTracker(**values)


def hold(t: StallTracker, done: int, inflight: bool, start: int, seconds: float,
         created: dict[int, int] | None = None) -> int:
    """Poll every POLL for `seconds` with the recorder unchanged; returns the time of the last poll."""
    now = start
    for _ in range(int(seconds * S / POLL)):
        prev, now = now, now + POLL
        t.update(0, samples(gloo(done, inflight, created=created)), now, prev)
    return now


def test_suspected_after_the_minimum_then_confirmed_at_the_stall_threshold() -> None:
    t = tracker()
    t.update(0, samples(gloo(3, False)), T0 + 4 * S - POLL, None)
    # #4 enqueued at T0 + 4 s (the recorder dates it), nothing completes after.
    now, suspected_at, confirmed_at = T0 + 4 * S - POLL, None, None
    while now < T0 + 70 * S:
        prev, now = now, now + POLL
        newly = t.update(0, samples(gloo(3, True)), now, prev)
        raised, ended = t.drain()
        if raised:
            suspected_at = now
        if newly:
            confirmed_at = now
            assert [(e.outcome, e.after_s) for e in ended] == [("confirmed", (now - suspected_at) / S)]
    assert suspected_at == T0 + 8 * S  # 4 s after the enqueue: the minimum, no rhythm learned yet
    assert confirmed_at == T0 + 64 * S  # --stall-after
    state = t.groups[(0, "0")]
    assert state.suspected and state.stalled and state.suspect_threshold_s == 4.0


def test_a_pause_with_nothing_in_flight_is_never_suspected() -> None:
    t = tracker()
    start = T0 + 10 * S
    t.update(0, samples(gloo(3, False)), start, None)
    end = hold(t, 3, False, start, 120.0)  # two minutes of checkpointing: every collective done
    assert t.drain() == ([], []) and not t.groups[(0, "0")].suspected
    # The next step's collective returns at once: still nothing.
    t.update(0, samples(gloo(4, False)), end + POLL, end)
    assert t.drain() == ([], [])


def test_suspicion_cleared_when_the_group_moves_on() -> None:
    t = tracker()
    t.update(0, samples(gloo(3, False)), T0 + 4 * S - POLL, None)
    now = hold(t, 3, True, T0 + 4 * S - POLL, 6.0)  # #4 waits 6 s (a peer checkpoints longer)
    raised, _ = t.drain()
    assert [g.sample.inflight_seq for g in raised] == [4]
    t.update(0, samples(gloo(4, False)), now + POLL, now)
    raised, ended = t.drain()
    assert raised == [] and [e.outcome for e in ended] == ["resumed"]
    assert ended[0].after_s == 2.0 and not t.groups[(0, "0")].suspected


def test_the_group_rhythm_raises_the_threshold_up_to_the_latest() -> None:
    t = tracker()
    now = T0
    t.update(0, samples(gloo(0, False)), now, None)
    # Every step's collective waits about 2 s (a slow peer): learned, no suspicion at 3 x 2 s.
    for step in range(1, 6):
        created = {seq: now + S for seq in range(step, step + 1)}
        now = hold(t, step - 1, True, now, 2.5, created={**{s: T0 for s in range(1, step)}, **created})
        prev, now = now, now + POLL
        t.update(0, samples(gloo(step, False, created={s: T0 for s in range(1, step + 1)})), now, prev)
    state = t.groups[(0, "0")]
    assert 1.0 <= state.rhythm.usual_wait_s <= 2.0
    assert state.suspect_threshold_s == 3 * state.rhythm.usual_wait_s
    assert [e.outcome for e in t.drain()[1]] == []
    # A group that waits ten times as long is capped: suspected after --suspect-after at the latest.
    rhythm = Rhythm()
    for _ in range(RHYTHM_EPISODES):
        rhythm.observe(10.0)
        rhythm.resolve()
    assert rhythm.threshold_s(4.0, 15.0) == 15.0
    assert Rhythm().threshold_s(4.0, 15.0) == 4.0


def test_suspicion_never_later_than_the_stall_and_off_with_zero() -> None:
    t = tracker(stall_after_s=3.0)  # a stall threshold below the suspicion minimum
    t.update(0, samples(gloo(3, False)), T0 + 4 * S - POLL, None)
    hold(t, 3, True, T0 + 4 * S - POLL, 5.0)
    raised, ended = t.drain()
    assert len(raised) == 1 and [e.outcome for e in ended] == ["confirmed"] and ended[0].after_s == 0.0
    off = tracker(suspect_after_s=0.0)
    off.update(0, samples(gloo(3, False)), T0 + 4 * S - POLL, None)
    hold(off, 3, True, T0 + 4 * S - POLL, 30.0)
    assert off.drain() == ([], []) and off.groups[(0, "0")].suspect_threshold_s == 60.0
