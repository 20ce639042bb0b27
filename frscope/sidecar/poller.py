"""Polling: one round over every local rank's worker server, the probe-or-full decision, and the
stall tracker's update (docs/sidecar.md, "What a poll costs").

A round finds the rank sockets, probes each rank's progress cheaply and fetches its full recorder
only when needed, feeds the samples to the `StallTracker`, and reports what happened (groups that
became stalled, trainers that exited). What to do about it (a stall capture, a push) is the
composition root's business (`frscope.sidecar.app`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from frscope.analysis.lateness import RankLateness, rank_lateness
from frscope.sidecar.client import PROGRESS_PROBES, Endpoint, WorkerClient, WorkerError, source_of
from frscope.sidecar.config import SidecarConfig
from frscope.sidecar.metrics import SidecarMetrics
from frscope.sidecar.progress import GroupState, StallTracker, SuspicionEnd, without_inflight
from frscope.sidecar.ranks import RankState, read_meta, scan_ranks
from frscope.sidecar.recorder import digest

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("frscope.sidecar")

# Trainer exits are these reasons (the socket refuses or is gone); a timeout is a wedged rank.
EXIT_REASONS = frozenset({"connect", "no_socket"})


@dataclass(frozen=True, slots=True)
class Round:
    """What one poll round found."""

    newly: list[GroupState]  # groups that became stalled
    # The capture due ("stall" or "suspect"; every live rank's full recorder was fetched for it), or None.
    capture: str | None
    exits: list[int]  # ranks whose trainer exited (went down with the socket refused or gone)
    suspected: list[GroupState] = field(default_factory=list)  # groups suspected at this round (not yet stalls)
    ended: list[SuspicionEnd] = field(default_factory=list)  # suspicions that ended at this round


class Poller:
    def __init__(self, config: SidecarConfig, tracker: StallTracker, metrics: SidecarMetrics) -> None:
        self.config = config
        self.tracker = tracker
        self.metrics = metrics
        self.ranks: dict[int, RankState] = {}
        self.ready = False
        self.polls_done = 0
        self.last_round_ns: int | None = None
        # Lateness of each local rank against the others (two or more ranks up), after every round.
        self.lateness: dict[int, RankLateness] = {}
        self._socket_dir_missing_logged = False
        self._parse_slot = asyncio.Semaphore(1)
        self._fetch_slots = asyncio.Semaphore(max(1, config.max_concurrency))

    async def close(self) -> None:
        for state in self.ranks.values():
            await state.client.close()

    def _client(self, endpoint: Endpoint) -> WorkerClient:
        return WorkerClient(endpoint, timeout_s=self.config.request_timeout_s, max_bytes=self.config.max_answer_bytes)

    async def round(self, want_full: bool, capture_wanted: Callable[[str], bool],
                    periodic: bool | None = None) -> Round:
        """One round over every local rank. `want_full`: every rank's full recorder, whatever its
        progress probe says. `capture_wanted(reason)` is asked when groups became stalled ("stall") or
        suspected ("suspect"): if it says yes, every live rank's full recorder of this moment is
        fetched for the capture. `periodic`: this
        round is the schedule's periodic full read (`schedule.PollSlot`); None: every
        --full-poll-every rounds of the rank's own count."""
        t0 = time.perf_counter()
        now_ns = time.time_ns()
        previous_round = self.last_round_ns
        found = await asyncio.to_thread(scan_ranks, self.config.socket_dir)
        if found is None:
            if not self._socket_dir_missing_logged:
                log.warning("socket dir %s does not exist (yet); no rank to poll", self.config.socket_dir)
                self._socket_dir_missing_logged = True
            found = {}
        elif self._socket_dir_missing_logged:
            log.info("socket dir %s is there now", self.config.socket_dir)
            self._socket_dir_missing_logged = False
        for rank, endpoint in found.items():
            known = self.ranks.get(rank)
            if known is None:
                self.ranks[rank] = RankState(rank, endpoint, self._client(endpoint))
                self.metrics.worker_up.labels(rank=str(rank)).set(0)
                self.metrics.wait.labels(rank=str(rank))  # a series from the start: 0 s until it waits
                log.info("rank %d: worker server %s found", rank, endpoint)
            elif known.endpoint != endpoint:
                # The rank moved: torch's debug server started in it (the bootstrap withdrew its socket), or a
                # new process serves the socket again. Same rank, same recorder history: only the client changes.
                await known.client.close()
                known.endpoint, known.client = endpoint, self._client(endpoint)
                known.probe = None  # ask again which probe it answers
                log.info("rank %d: worker server now at %s", rank, endpoint)
        went_down: list[int] = []
        for rank, state in self.ranks.items():
            if rank not in found:
                if self._mark_down(state, WorkerError("no_socket", _gone(state.endpoint)), now_ns):
                    went_down.append(rank)
        results = await asyncio.gather(
            *(self._poll_rank(self.ranks[rank], now_ns, previous_round, want_full, periodic)
              for rank in sorted(found))
        )
        newly: list[GroupState] = []
        for rank, (stalled, down) in zip(sorted(found), results, strict=True):
            newly.extend(stalled)
            if down:
                went_down.append(rank)
        raised, ended = self.tracker.drain()
        capture: str | None = None
        if newly and capture_wanted("stall"):
            capture = "stall"
        elif any(not g.stalled for g in raised) and capture_wanted("suspect"):
            capture = "suspect"
        if capture:
            # Every live rank's full recorder of this moment (a rank that only answered its probe
            # this round is fetched now); the capture then takes every rank's stacks.
            behind = [s for s in self.ranks.values() if s.up and s.raw_ns != now_ns]
            more = await asyncio.gather(
                *(self._fetch_full(s, now_ns, previous_round, "stall_capture") for s in behind)
            )
            seen = {(g.rank, g.sample.pg) for g in newly}
            for state, (extra, down) in zip(behind, more, strict=True):
                newly.extend(g for g in extra if (g.rank, g.sample.pg) not in seen)
                if down:
                    went_down.append(state.rank)
            more_raised, more_ended = self.tracker.drain()
            raised.extend(more_raised)
            ended.extend(more_ended)
        self.last_round_ns = now_ns
        self.metrics.show_progress(self.tracker, now_ns)
        self.polls_done += 1
        self.metrics.polls.inc()
        self.metrics.poll_duration.observe(time.perf_counter() - t0)
        if not self.ready:
            self.ready = True
            log.info("first poll done: %d rank socket(s)", len(found))
        for group in newly:
            self.metrics.count_stall(group.rank, group.sample.pg)
            age = group.inflight_age_s(now_ns)
            log.warning(
                "stall: rank %d, group %s%s: %s #%s in flight%s, no progress for %.1f s (threshold %.1f s)",
                group.rank, group.sample.pg, f" ({group.sample.desc})" if group.sample.desc else "",
                group.sample.inflight_op, group.sample.inflight_seq,
                f" for {age:.1f} s" if age is not None else "", (now_ns - group.progress_ns) / 1e9, group.threshold_s,
            )
        suspected = [g for g in raised if not g.stalled]
        self._report_suspicions(suspected, ended, now_ns)
        self._update_lateness()
        exits = [r for r in went_down if self.ranks[r].reason in EXIT_REASONS and self.ranks[r].ever_up]
        return Round(newly, capture, exits, suspected, ended)

    def _update_lateness(self) -> None:
        """Which local rank the others keep waiting for (frscope.analysis.lateness), from the arrivals of
        the ranks' kept recorders; a rank becoming or ceasing to be a straggler is logged once."""
        arrivals = {
            rank: {pg: g.sample.arrivals for pg, g in self.tracker.for_rank(rank).items() if g.sample.arrivals}
            for rank, state in self.ranks.items() if state.up
        }
        found = (rank_lateness(arrivals, min_share=self.config.straggler_min_share) if len(arrivals) >= 2
                 else {})
        for rank, now in found.items():
            before = self.lateness.get(rank)
            if now.straggler and (before is None or not before.straggler):
                log.warning("straggler: rank %d is late at %d of the last %d collectives of group %s, by %.3f s on "
                            "average: it costs the job %.0f%% of its time", rank, now.late, now.compared, now.group,
                            now.lateness_s, 100 * now.share)
            elif before is not None and before.straggler and not now.straggler:
                log.info("straggler: rank %d keeps up again (it costs the job %.0f%% of its time)", rank,
                         100 * now.share)
        self.lateness = found
        self.metrics.show_lateness(found, self.ranks)

    def _report_suspicions(self, suspected: list[GroupState], ended: list[SuspicionEnd], now_ns: int) -> None:
        for group in suspected:
            age = group.inflight_age_s(now_ns)
            log.warning(
                "suspected stall: rank %d, group %s%s: %s #%s in flight%s, no progress for %.1f s (its usual "
                "wait %.1f s, suspected after %.1f s, a stall after %.1f s)",
                group.rank, group.sample.pg, f" ({group.sample.desc})" if group.sample.desc else "",
                group.sample.inflight_op, group.sample.inflight_seq, f" for {age:.1f} s" if age is not None else "",
                (now_ns - group.progress_ns) / 1e9, group.rhythm.usual_wait_s, group.suspect_threshold_s,
                group.threshold_s,
            )
        for end in ended:
            self.metrics.suspected_stalls.labels(outcome=end.outcome).inc()
            if end.outcome == "resumed":
                log.info("suspected stall resumed: rank %d, group %s moved on after %.1f s without progress "
                         "(%.1f s after the suspicion)", end.group.rank, end.group.sample.pg, end.quiet_s,
                         end.after_s)

    async def _poll_rank(
        self, state: RankState, now_ns: int, previous_round: int | None, force_full: bool = False,
        periodic: bool | None = None,
    ) -> tuple[list[GroupState], bool]:
        """Probe the rank's progress; fetch its full recorder only when needed (docs/sidecar.md, "What
        a poll costs"): no recorder kept yet or the rank (re)appeared, every --full-poll-every polls,
        ?refresh=1, no probe available, or the probe suggests a stall (a collective in flight and no
        change since the previous poll) that the kept recorder does not show yet."""
        state.last_poll_ns = now_ns
        probed = False
        moved = False
        inflight = False
        cause = None
        try:
            if state.probe is None or not state.up:
                state.probe = await self._find_probe(state)
                state.probe_fp = state.full_fp = None
                state.dates = None  # a new process may have the timings handler, or not
            if state.probe[0]:
                async with self._fetch_slots:
                    fp, inflight = await state.client.probe(*state.probe)
                probed = True
                if fp != state.probe_fp:
                    moved = state.probe_fp is not None
                    state.probe_before_ns = state.probe_ns
                    state.probe_first_ns = now_ns
                    state.probe_fp = fp
                state.probe_ns = now_ns
        except WorkerError as exc:
            return [], self._mark_down(state, exc, now_ns)
        stalled_here = any(g.stalled for g in self.tracker.for_rank(state.rank).values())
        if force_full:
            cause = "refresh"
        elif not state.up or state.raw_z is None:
            cause = "first"
        elif not probed:
            cause = "no_probe"
        elif self._periodic_due(state, periodic):
            cause = "periodic"
        elif moved and stalled_here:
            cause = "resumed"
        elif moved and not state.samples:
            # The first collectives since a recorder read empty (the rank had just joined): read them
            # now, once, so a rank that crashes a few steps in leaves more than an empty recorder.
            cause = "started"
        elif inflight and not moved and state.probe_fp != state.full_fp:
            cause = "suspect"
        if cause is not None:
            found = await self._fetch_full(state, now_ns, previous_round, cause)
            self._sample_wait(state, now_ns, inflight if probed else None)
            return found
        # The probe is enough: the kept recorder's samples, with what the probe adds.
        state.polls_since_full += 1
        self._mark_up(state, now_ns)
        self._sample_wait(state, now_ns, inflight)
        samples = state.samples
        if moved or not inflight:
            samples = without_inflight(samples)
        return self.tracker.update(state.rank, samples, now_ns, previous_round, moved=moved), False

    def _periodic_due(self, state: RankState, periodic: bool | None) -> bool:
        """On the schedule's periodic round (every rank of the job at the same moment: the job pays one
        step's delay a period, not one for each rank's own moment); a rank that missed it (a round
        overran its slot) catches up after twice the period."""
        every = self.config.full_poll_every
        if periodic is None:
            return state.polls_since_full + 1 >= every
        return periodic or state.polls_since_full + 1 >= 2 * every

    def _sample_wait(self, state: RankState, now_ns: int, inflight: bool | None) -> None:
        """frscope_collective_wait_seconds for a rank whose recorder dates no durations (gloo; NCCL
        without timing): a poll that finds a collective in flight (`inflight`: the probe's answer; None:
        the fresh recorder's) counts the time since the rank's previous poll, at most two poll
        intervals. Sampled at the poll rhythm, so the sum is exact only over many polls."""
        before, state.wait_sampled_ns = state.wait_sampled_ns, (now_ns if state.up else None)
        if not state.up or state.timed or before is None:
            return
        if inflight is None:
            inflight = any(sample.inflight for sample in state.samples.values())
        if inflight:
            seconds = min((now_ns - before) / 1e9, 2 * self.config.poll_interval_s)
            self.metrics.wait.labels(rank=str(state.rank)).inc(max(seconds, 0.0))

    async def _find_probe(self, state: RankState) -> tuple[str, str]:
        """The first probe of client.PROGRESS_PROBES the rank answers with a pg_status; ("", "") if none.
        A rank that cannot be reached at all raises WorkerError."""
        if self.config.full_poll_every <= 1:
            return ("", "")
        before = state.probe
        for handler, query in PROGRESS_PROBES:
            try:
                async with self._fetch_slots:
                    fp, _inflight = await state.client.probe(handler, query)
            except WorkerError as exc:
                if exc.reason in ("http", "decode"):
                    continue
                raise
            if fp or handler == "frscope_progress":
                if before != (handler, query):
                    log.info("rank %d: progress probe %s; full recorder every %d polls or on a suspected stall",
                             state.rank, handler, self.config.full_poll_every)
                return (handler, query)
        if before != ("", ""):
            log.info("rank %d: no progress probe; the full recorder is fetched at every poll", state.rank)
        return ("", "")

    def _mark_up(self, state: RankState, now_ns: int) -> None:
        if not state.up:
            log.info("rank %d: worker server at %s answers%s", state.rank, state.endpoint,
                     " again" if state.ever_up else "")
        state.up, state.ever_up, state.error, state.reason = True, True, None, None
        state.last_ok_ns = now_ns
        self.metrics.worker_up.labels(rank=str(state.rank)).set(1)

    async def _fetch_full(self, state: RankState, now_ns: int, previous_round: int | None,
                          cause: str) -> tuple[list[GroupState], bool]:
        """fr_trace_json: parse, count, track: (groups that became stalled, whether the rank went down
        at this fetch)."""
        source = source_of(state.endpoint)
        try:
            async with self._fetch_slots:
                raw_z, raw_hash, _size = await state.client.fr_trace_json()
            timings_raw = await self._fetch_timings(state)
            # What the bootstrap wrote, at every full fetch: torchrun restarts a worker in place (same
            # socket name, new process and restart count) faster than a rank is seen down.
            state.meta = await asyncio.to_thread(read_meta, self.config.socket_dir, state.rank)
            async with self._parse_slot:
                got = await asyncio.to_thread(digest, raw_z, raw_hash, state.rank, source, state, timings_raw)
        except WorkerError as exc:
            return [], self._mark_down(state, exc, now_ns)
        self.metrics.recorder_fetches.labels(cause=cause).inc()
        rank_label = str(state.rank)
        first_sight = state.raw_ns is None  # no full recorder of this rank fetched before
        self._mark_up(state, now_ns)
        state.raw_ns = now_ns
        state.full_fp = state.probe_fp
        state.polls_since_full = 0
        if got.raw_z is not None:
            state.raw_z = got.raw_z
            state.raw_hash = got.raw_hash
        state.count_watermark, state.duration_watermark = got.count_watermark, got.duration_watermark
        state.timings_json = got.timings_json
        if got.timings_problem:
            log.warning("rank %d: %s", state.rank, got.timings_problem)
        for pg, op in got.new_ops:
            self.metrics.count_collective(state.rank, pg, op)
        for op, seconds in got.durations:
            self.metrics.duration.labels(op=op).observe(seconds)
        state.timed = got.timed
        if got.durations and not first_sight:
            # (The history a first fetch finds happened before this sidecar watched: a restarted
            # sidecar would count it twice, and ranks on pods whose sidecars started at other times not.)
            self.metrics.wait.labels(rank=rank_label).inc(sum(seconds for _op, seconds in got.durations))
        if got.info != state.info:
            state.info = got.info
            self.metrics.recorder_info.labels(rank=rank_label).info(got.info)
        samples = got.samples if got.samples is not None else state.samples
        state.samples = samples
        if state.probe_fp is not None and state.probe_first_ns is not None:
            # A change the recorder cannot date happened after the probe before the current
            # progress was first seen, and by the probe that first saw it.
            return self.tracker.update(state.rank, samples, now_ns, state.probe_before_ns,
                                       changed_by_ns=state.probe_first_ns), False
        return self.tracker.update(state.rank, samples, now_ns, previous_round), False

    async def _fetch_timings(self, state: RankState) -> bytes | None:
        """The rank's own collective times (the bootstrap's frscope_timings), right after its recorder;
        None where it dates none (asked once per process) or did not answer this time."""
        if state.dates is False:
            return None
        try:
            async with self._fetch_slots:
                raw = await state.client.timings()
        except WorkerError as exc:
            if exc.reason == "http":
                state.dates = False
                log.info("rank %d: no frscope_timings handler (no bootstrap, or an older one): durations only "
                         "where its recorder dates them", state.rank)
            elif exc.reason in ("oversized", "timeout", "protocol"):
                log.warning("rank %d: frscope_timings: %s", state.rank, exc.message)
            return None
        if state.dates is None:
            state.dates = True
            log.info("rank %d: dates its own collectives (frscope_timings)", state.rank)
        return raw

    def _mark_down(self, state: RankState, exc: WorkerError, now_ns: int) -> bool:
        """Record a failed poll; True when the rank was up until now."""
        self.metrics.poll_errors.labels(rank=str(state.rank), reason=exc.reason).inc()
        self.metrics.worker_up.labels(rank=str(state.rank)).set(0)
        was_up = state.up
        if was_up or state.reason != exc.reason:
            kept = ""
            if state.last_ok_ns is not None:
                kept = f"; its last good recorder ({(now_ns - state.last_ok_ns) / 1e9:.1f} s old) is kept"
            log.warning("rank %d: %s%s", state.rank, exc.message, kept)
        state.up, state.error, state.reason = False, exc.message, exc.reason
        state.wait_sampled_ns = None  # what it did while unreachable is unknown: not a wait
        return was_up

    async def refresh_recorders(self) -> None:
        """Every live rank's full recorder of the latest round, for a capture that a round did not ask
        for (a hang the recorder cannot see: the kept recorders may be a few probes old, and the
        capture's age is read from when they were fetched)."""
        now_ns = self.last_round_ns or time.time_ns()
        behind = [s for s in self.ranks.values() if s.up and s.raw_ns != now_ns]
        await asyncio.gather(*(self._fetch_full(s, now_ns, None, "stall_capture") for s in behind))

    async def fetch_stacks(self) -> list[int]:
        """dump_traceback from every rank that answered the last round; the ranks that gave one."""
        ranks = [s for s in self.ranks.values() if s.up and s.raw_ns is not None]

        async def one(state: RankState) -> bool:
            try:
                async with self._fetch_slots:
                    text = await state.client.dump_traceback(self.config.stacks_timeout_s,
                                                             self.config.max_stacks_bytes)
            except WorkerError as exc:
                self.metrics.poll_errors.labels(rank=str(state.rank), reason=exc.reason).inc()
                log.warning("rank %d: no stacks: %s", state.rank, exc.message)
                return False
            state.stacks, state.stacks_for_ns = text, state.raw_ns
            return True

        got = await asyncio.gather(*(one(s) for s in ranks))
        return [s.rank for s, ok in zip(ranks, got, strict=True) if ok]


def _gone(endpoint: Endpoint) -> str:
    """What a poll says of a rank whose worker server disappeared (the socket file, or the port's file)."""
    return f"socket {endpoint} is gone" if isinstance(endpoint, Path) else f"{endpoint} is gone"
