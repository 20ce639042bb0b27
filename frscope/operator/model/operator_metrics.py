"""The operator's Prometheus metrics, on an injected CollectorRegistry (tests make their own).

Labels stay bounded: categories and signal kinds are closed sets; no pods or ranks. Job names appear
in `frscope_operator_job_diagnosis`, whose series exist while the job does (removed when it is
deleted), so the dashboard's diagnosis panels follow $namespace/$job, and in the live windows'
`frscope_operator_job_perf_*` (`perf_metrics`: only while a window is kept; a rank only for the top 3).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from frscope.analysis import Category
from frscope.operator.model.perf_metrics import PerfMetrics
from frscope.operator.model.signals import SignalKind

GATHER_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120)


class OperatorMetrics:
    ACTION_LABELS = ("restart", "stop", "cordon", "dry-run")

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.diagnoses = Counter(
            "frscope_operator_diagnoses", "Diagnoses published, by the top finding's category.",
            ["category"], registry=registry,
        )
        self.suspicions = Counter(
            "frscope_operator_suspected_stalls",
            "Suspected stalls of jobs, by outcome: published (the culprit named, not confirmed), resumed (the "
            "job moved on), confirmed (the sidecars' --stall-after passed), unnamed (the gather named no culprit).",
            ["outcome"], registry=registry,
        )
        self.stragglers = Counter(
            "frscope_operator_stragglers",
            "Stragglers reported on jobs (a rank newly reported by its sidecar, or a pod newly late across pods).",
            registry=registry,
        )
        self.lateness_compare_seconds = Histogram(
            "frscope_operator_lateness_compare_seconds",
            "Time to merge a job's arrivals from one status sweep and compare its pods (in a worker thread).",
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2.0, 10.0), registry=registry,
        )
        self.gather_duration = Histogram(
            "frscope_operator_gather_duration_seconds", "Time to gather every sidecar of a job.",
            buckets=GATHER_BUCKETS, registry=registry,
        )
        self.signal_to_publish = Histogram(
            "frscope_operator_signal_to_condition_seconds",
            "From the first signal of an incident to its condition written.",
            buckets=GATHER_BUCKETS, registry=registry,
        )
        self.sidecars_unreachable = Counter(
            "frscope_operator_sidecars_unreachable", "Sidecars that could not be gathered from (per gather).",
            registry=registry,
        )
        self.status_poll_errors = Counter(
            "frscope_operator_status_poll_errors", "Failed /v1/status polls of sidecars.", registry=registry,
        )
        self.job_diagnosis = Gauge(
            "frscope_operator_job_diagnosis",
            "1 for each watched job (any kind) with a published diagnosis, by its latest top finding's "
            "category "
            "(removed when the job is deleted)",
            ["namespace", "training_job", "category"], registry=registry,
        )
        self._diagnosed: dict[tuple[str, str], str] = {}
        self.perf = PerfMetrics(registry)
        self.jobs_watched = Gauge("frscope_operator_jobs_watched", "Training jobs being watched (any kind).",
                                  registry=registry)
        self.pods_watched = Gauge("frscope_operator_pods_watched", "Pods of watched jobs.", registry=registry)
        self.signals = Counter(
            "frscope_operator_signals", "Signals received, by kind.", ["kind"], registry=registry,
        )
        self.pushes = Counter(
            "frscope_operator_pushes", "Snapshots pushed by sidecars, by result.", ["result"], registry=registry,
        )
        self.publish_errors = Counter(
            "frscope_operator_publish_errors", "Writes to the API server that failed after retries, by step.",
            ["step"], registry=registry,
        )
        self.actions = Counter(
            "frscope_operator_actions",
            "Actions on diagnosed jobs (docs/actions.md), by action (restart, stop, cordon, dry-run) and outcome "
            "(done, failed, skipped).",
            ["action", "outcome"], registry=registry,
        )
        self.action_saved_gpu_seconds = Counter(
            "frscope_operator_action_saved_gpu_seconds",
            "GPU-seconds saved by ending hung jobs before their watchdog timeout, by action (restart, stop).",
            ["action"], registry=registry,
        )
        for action in self.ACTION_LABELS:
            for outcome in ("done", "failed", "skipped"):
                self.actions.labels(action=action, outcome=outcome)
        for action in ("restart", "stop"):
            self.action_saved_gpu_seconds.labels(action=action)
        for category in Category:
            self.diagnoses.labels(category=category.value)
        for kind in SignalKind:
            self.signals.labels(kind=kind.value)
        for result in ("accepted", "rejected", "throttled"):
            self.pushes.labels(result=result)
        for outcome in ("published", "resumed", "confirmed", "unnamed"):
            self.suspicions.labels(outcome=outcome)

    def job_diagnosed(self, namespace: str, job: str, category: str) -> None:
        """The job's latest diagnosis is of `category` (one series per job)."""
        old = self._diagnosed.get((namespace, job))
        if old is not None and old != category:
            self.job_diagnosis.remove(namespace, job, old)
        self._diagnosed[(namespace, job)] = category
        self.job_diagnosis.labels(namespace=namespace, training_job=job, category=category).set(1)

    def job_gone(self, namespace: str, job: str) -> None:
        old = self._diagnosed.pop((namespace, job), None)
        if old is not None:
            self.job_diagnosis.remove(namespace, job, old)
