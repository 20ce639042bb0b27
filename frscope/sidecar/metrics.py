"""The sidecar's Prometheus metrics, all on an injected CollectorRegistry (never the global one).

Labels are bounded: `rank` (the ranks of one pod, so at most its processes), `pg` (process group names),
`op` (frscope.analysis.op_label's fixed set), `reason`/`kind`/`result` (fixed sets below). No sequence
ids, shapes or job ids in labels: those are values or live in /v1/status.

How many series a pod exports (docs/sidecar.md, "Metrics: how many series"): the collective gauges and
counters that would carry one series per rank *and* process group are aggregated over the pod by default
(`--metrics-detail pod`): a rank of a 3-D parallel job is in four or more groups, and with pipeline and
data parallel groups that differ per rank, a pod's series would grow with ranks x groups.
`--metrics-detail rank-group` asks for the detail (one series per rank and group, and the per-group
sequence ids, thresholds and rhythm that mean nothing summed over groups).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from frscope import __version__
from frscope.analysis.lateness import RankLateness
from frscope.sidecar.config import DEFAULT_METRICS_DETAIL, METRICS_DETAILS
from frscope.sidecar.evidence import EvidenceStore
from frscope.sidecar.progress import SUSPICION_OUTCOMES, StallTracker
from frscope.sidecar.unrecorded import UnrecordedWatch

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0)
POLL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FETCH_CAUSES = ("first", "started", "periodic", "suspect", "resumed", "stall_capture", "refresh", "no_probe")
DUMP_KINDS = ("dump_file", "stall_capture", "refresh")
PUSH_RESULTS = ("ok", "retry", "failed", "dropped")


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry, detail: str = DEFAULT_METRICS_DETAIL) -> None:
        if detail not in METRICS_DETAILS:
            raise ValueError(f"metrics detail {detail!r}: not one of {', '.join(METRICS_DETAILS)}")
        self.registry = registry
        self.detail = detail
        self.per_group = detail == "rank-group"
        # Per rank and group, or (the default) one series for the pod: its groups of every local rank.
        rp = ["rank", "pg"] if self.per_group else []
        where = "the rank's group" if self.per_group else "a group of any of the pod's ranks"
        self.stalled = Gauge(
            "frscope_collective_stalled",
            f"1 while {where} has a collective in flight with no progress for the stall threshold",
            rp, registry=registry,
        )
        self.inflight_age = Gauge(
            "frscope_collective_inflight_age_seconds",
            "Age of the oldest collective in flight " + ("in the group" if self.per_group else "in the pod's groups")
            + " at the last poll (0: none in flight)",
            rp, registry=registry,
        )
        self.stalls = Counter(
            "frscope_stalls", "Stalls detected (transitions of a rank's group to stalled)", rp, registry=registry
        )
        self.suspected = Gauge(
            "frscope_collective_suspected",
            f"1 while {where} has a collective in flight with no progress for longer than its rhythm allows "
            "(suspected; stays 1 once the stall is confirmed, until the group makes progress)",
            rp, registry=registry,
        )
        # Per group only (--metrics-detail rank-group): numbers that mean nothing across groups.
        self.last_enqueued: Gauge | None = None
        self.last_completed: Gauge | None = None
        self.stall_threshold: Gauge | None = None
        self.suspect_threshold: Gauge | None = None
        self.usual_wait: Gauge | None = None
        if self.per_group:
            self.last_enqueued = Gauge(
                "frscope_collective_last_enqueued_seq",
                "Highest collective_seq_id the rank has enqueued in the group",
                rp, registry=registry,
            )
            self.last_completed = Gauge(
                "frscope_collective_last_completed_seq",
                "Highest collective_seq_id up to which the rank has completed every collective of the group",
                rp, registry=registry,
            )
            self.stall_threshold = Gauge(
                "frscope_collective_stall_threshold_seconds",
                "The stall threshold in force: --stall-after capped at a fraction of the entry's timeout",
                rp, registry=registry,
            )
            self.suspect_threshold = Gauge(
                "frscope_collective_suspect_threshold_seconds",
                "No progress with a collective in flight for this long makes the group suspected: 3 x its usual "
                "wait, within --suspect-min and --suspect-after, at most the stall threshold",
                rp, registry=registry,
            )
            self.usual_wait = Gauge(
                "frscope_collective_usual_wait_seconds",
                "The longest a collective of the group waited with no progress in its recent episodes that ended "
                "in progress, as the polls saw it (the group's rhythm; 0: none seen waiting)",
                rp, registry=registry,
            )
        self.suspected_stalls = Counter(
            "frscope_suspected_stalls",
            "Suspected stalls by how they ended: resumed (the group made progress before --stall-after), "
            "confirmed (it became a stall)",
            ["outcome"], registry=registry,
        )
        self.collectives = Counter(
            "frscope_collectives",
            "Collectives and p2p ops " + ("the rank enqueued" if self.per_group else "the pod's ranks enqueued")
            + ", as seen in the recorders",
            [*rp, "op"], registry=registry,
        )
        self.duration = Histogram(
            "frscope_collective_duration_seconds",
            "Duration of completed collectives, where the recorder has durations (NCCL with timing)",
            ["op"], buckets=DURATION_BUCKETS, registry=registry,
        )
        self.wait = Counter(
            "frscope_collective_wait_seconds",
            "Seconds the rank spent inside collectives, waiting for its peers and then transferring: the "
            "recorded durations of completed collectives where its recorder has them (NCCL with "
            "TORCH_NCCL_ENABLE_TIMING=1) or the rank dates them (the bootstrap's frscope_timings), else "
            "sampled at every poll (a collective in flight counts the time "
            "since the rank's previous poll). The rank that arrives late waits least: the job's highest rate "
            "minus a rank's rate is how long the others wait for it (docs/sidecar.md)",
            ["rank"], registry=registry,
        )
        self.lateness = Gauge(
            "frscope_rank_lateness_seconds",
            "How late the rank arrives, on average, at the collectives where the pod's other ranks wait for it "
            "(the last 60 s of its recorder; 0: never the one waited for)",
            ["rank"], registry=registry,
        )
        self.lateness_ratio = Gauge(
            "frscope_rank_lateness_ratio",
            "Fraction of the job's time the pod's other ranks spent waiting for this rank (the last 60 s)",
            ["rank"], registry=registry,
        )
        self.straggler = Gauge(
            "frscope_rank_straggler",
            "1 while the rank is a straggler: late far more often than chance, costing the job >= 10% of its time",
            ["rank"], registry=registry,
        )
        self.unrecorded_suspected = Gauge(
            "frscope_unrecorded_wait_suspected",
            "1 while the rank's stack waits in a torch.distributed call its recorder does not show (gloo's p2p, "
            "monitored_barrier) with every recorder of the pod idle past the job's usual step: a suspected hang "
            "the recorder cannot see (stays 1 once confirmed, until the recorders or the stacks move)",
            ["rank"], registry=registry,
        )
        self.unrecorded_stalled = Gauge(
            "frscope_unrecorded_wait_stalled",
            "1 while such a wait is confirmed: the recorders idle for --stall-after with the rank's stack still "
            "in the same torch.distributed call",
            ["rank"], registry=registry,
        )
        self.recorder_quiet = Gauge(
            "frscope_recorder_quiet_seconds",
            "How long no recorder of the pod's live ranks has moved with nothing in flight (0: something in "
            "flight, or a recorder moved at the last poll)",
            registry=registry,
        )
        self.recorder_quiet_threshold = Gauge(
            "frscope_recorder_quiet_threshold_seconds",
            "Quiet recorders past this make the sidecar read the ranks' stacks: 3 x the job's usual step, within "
            "--suspect-min and --suspect-after, at most --stall-after",
            registry=registry,
        )
        self.worker_up = Gauge(
            "frscope_worker_up", "1 when the rank's worker server answered the last poll", ["rank"],
            registry=registry,
        )
        self.poll_errors = Counter(
            "frscope_poll_errors", "Failed polls of a rank's worker server", ["rank", "reason"], registry=registry
        )
        self.polls = Counter("frscope_polls", "Poll rounds over every local rank", registry=registry)
        self.recorder_fetches = Counter(
            "frscope_recorder_fetches",
            "Full recorders fetched (fr_trace_json), by cause: first (new or returning rank), started (the "
            "first progress after an empty recorder), periodic "
            "(--full-poll-every), suspect (progress stopped with a collective in flight), resumed, "
            "stall_capture, refresh (?refresh=1), no_probe (the rank has no cheap progress probe)",
            ["cause"], registry=registry,
        )
        self.poll_duration = Histogram(
            "frscope_poll_duration_seconds", "Wall time of one poll round", buckets=POLL_BUCKETS, registry=registry
        )
        self.dumps_collected = Counter(
            "frscope_dumps_collected",
            "Recorders collected: dump_file (on-timeout dump parsed), stall_capture, refresh (per rank)",
            ["kind"], registry=registry,
        )
        self.dump_files_rejected = Counter(
            "frscope_dump_files_rejected", "Dump files that could not be used", ["reason"], registry=registry
        )
        self.evidence_write_errors = Counter(
            "frscope_evidence_write_errors", "Captures that could not be written to the evidence dir",
            registry=registry,
        )
        self.evidence_files = Gauge(
            "frscope_evidence_files", "Captures kept in the evidence dir", registry=registry
        )
        self.evidence_bytes = Gauge(
            "frscope_evidence_bytes", "Bytes of captures kept in the evidence dir", registry=registry
        )
        self.pushes = Counter("frscope_pushes", "Pushes to the operator", ["result"], registry=registry)
        self.recorder_info = Info(
            "frscope_recorder", "What each rank runs: torch version, backend, recorder format version",
            ["rank"], registry=registry,
        )
        self.sidecar_info = Info("frscope_sidecar", "The sidecar's build", registry=registry)
        self.sidecar_info.info({"version": __version__})
        for kind in DUMP_KINDS:
            self.dumps_collected.labels(kind=kind)
        for cause in FETCH_CAUSES:
            self.recorder_fetches.labels(cause=cause)
        for result in PUSH_RESULTS:
            self.pushes.labels(result=result)
        for outcome in SUSPICION_OUTCOMES:
            self.suspected_stalls.labels(outcome=outcome)

    def count_collective(self, rank: int, pg: str, op: str) -> None:
        """One more collective of `op` seen in a rank's recorder."""
        labels = {"rank": str(rank), "pg": pg} if self.per_group else {}
        self.collectives.labels(**labels, op=op).inc()

    def count_stall(self, rank: int, pg: str) -> None:
        """A rank's group became stalled."""
        (self.stalls.labels(rank=str(rank), pg=pg) if self.per_group else self.stalls).inc()

    def show_progress(self, tracker: StallTracker, now_ns: int) -> None:
        """Every tracked group's progress gauges (or the pod's aggregate of them), after a poll round."""
        if not self.per_group:
            groups = tracker.groups.values()
            self.stalled.set(1 if any(g.stalled for g in groups) else 0)
            self.suspected.set(1 if any(g.suspected for g in groups) else 0)
            self.inflight_age.set(max((g.inflight_age_s(now_ns) or 0.0 for g in groups), default=0.0))
            return
        assert self.last_enqueued is not None and self.last_completed is not None
        assert self.stall_threshold is not None and self.suspect_threshold is not None
        assert self.usual_wait is not None
        for (rank, pg), group in tracker.groups.items():
            labels = {"rank": str(rank), "pg": pg}
            sample = group.sample
            if sample.last_enqueued_seq is not None:
                self.last_enqueued.labels(**labels).set(sample.last_enqueued_seq)
            if sample.last_completed_seq is not None:
                self.last_completed.labels(**labels).set(sample.last_completed_seq)
            self.stalled.labels(**labels).set(1 if group.stalled else 0)
            self.inflight_age.labels(**labels).set(group.inflight_age_s(now_ns) or 0.0)
            self.stall_threshold.labels(**labels).set(group.threshold_s)
            self.suspected.labels(**labels).set(1 if group.suspected else 0)
            self.suspect_threshold.labels(**labels).set(group.suspect_threshold_s)
            self.usual_wait.labels(**labels).set(group.rhythm.usual_wait_s)

    def show_unrecorded(self, watch: UnrecordedWatch, ranks: Mapping[int, object], now_ns: int) -> None:
        """The watch for hangs the recorder cannot see, after a poll round."""
        for rank in ranks:
            label = str(rank)
            blocked = watch.suspected and rank in watch.blocked
            self.unrecorded_suspected.labels(rank=label).set(1 if blocked else 0)
            self.unrecorded_stalled.labels(rank=label).set(1 if blocked and watch.stalled else 0)
        self.recorder_quiet.set(watch.quiet_s(now_ns))
        self.recorder_quiet_threshold.set(watch.threshold_s)

    def show_lateness(self, found: dict[int, RankLateness], ranks: Mapping[int, object]) -> None:
        """Every local rank's lateness against the others (0 where not compared), after a poll round."""
        for rank in ranks:
            got = found.get(rank)
            label = str(rank)
            self.lateness.labels(rank=label).set(got.lateness_s if got else 0.0)
            self.lateness_ratio.labels(rank=label).set(got.share if got else 0.0)
            self.straggler.labels(rank=label).set(1 if got is not None and got.straggler else 0)

    def show_evidence(self, evidence: EvidenceStore) -> None:
        """What the evidence dir holds, after a scan or a capture."""
        self.evidence_files.set(len(evidence.on_disk))
        self.evidence_bytes.set(evidence.total_bytes)
