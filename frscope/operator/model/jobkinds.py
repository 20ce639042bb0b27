"""The kinds of training job frscope diagnoses, and what differs between them.

- `pytorchjob`: Kubeflow training operator v1 (`kubeflow.org/v1` PyTorchJob). Pods carry
  `training.kubeflow.org/job-name`, replica type (Master/Worker) and index. Conditions are the
  training operator's JobCondition (with `lastUpdateTime`); the job's state is its latest condition.
- `trainjob`: Kubeflow Trainer v2 (`trainer.kubeflow.org/v1alpha1` TrainJob). Trainer builds a JobSet
  of the TrainJob's name (owned by it); the pods carry only JobSet's labels (`jobset.sigs.k8s.io/
  jobset-name` = the TrainJob's name, replicated-job name, job index) and the batch Job's
  completion index; the TrainJob's own labels reach the JobSet and Jobs, not the pods. Conditions are
  `metav1.Condition` (map list keyed by `type`; reason CamelCase, message <= 32768, observedGeneration).
- `jobset`: a bare JobSet (`jobset.x-k8s.io/v1alpha2`), same pod labels and condition type. A JobSet
  owned by a TrainJob is not a job of its own: it is diagnosed as that TrainJob (or not at all when
  the `trainjob` kind is switched off).

Ranks are never derived from these labels: every rank is named by the recorder dumps themselves, and
the pod -> ranks map comes from what each pod's sidecar reports (the torchrun env of the pod,
PET_NODE_RANK = the Job's completion index for Trainer). Labels only find the pods and order them.

A PyTorchJob and a JobSet/TrainJob of the same name in one namespace would share a key in the
operator; the first one seen is kept and the other ignored with a warning (store.JobStore).

Each kind also says how it is acted on (docs/actions.md), through what its own controller honours:
`inactive` (finished, suspended, being deleted), `restart_refusal` (why deleting every pod of the job
would not bring it back), `stop_patch` (the merge patch that suspends it). The I/O of acting (the
pods, a TrainJob's JobSet, a Kueue Workload) is in actions/jobs.py.

- PyTorchJob (training operator v1.8.1, pkg/controller.v1/common/pod.go ReconcilePods, job.go
  ReconcileJobs): a replica index with no pod gets a new pod; a pod seen Failed first (the kubelet
  gives a deleted pod a terminal phase) is restarted for OnFailure/Always, for ExitCode when the exit
  code is >= 128 (SIGTERM: 143), and with Never the job fails. Stop: `spec.runPolicy.suspend` (the
  operator deletes the pods and services, condition Suspended; set back to false to resume).
- JobSet (v0.12.0, v0.11.0) runs one batch Job per replica of each replicated job; whether deleting its pods
  brings it back (the Job controller's backoffLimit, the JobSet's failurePolicy rules and maxRestarts)
  is jobset_restart.py's. Stop: `spec.suspend` (the JobSet suspends its Jobs, whose controller deletes
  their pods; condition Suspended).
- TrainJob (Trainer v2.3.0, pkg/controller/trainjob_controller.go, runtime/framework/plugins/jobset):
  Trainer builds the JobSet once and does not restart anything itself; restarting is the JobSet's (as
  above, read from the JobSet it owns; Trainer's torch runtime sets no failurePolicy and one Job with
  parallelism = numNodes). Stop: the TrainJob's `spec.suspend`, which Trainer copies to its JobSet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from frscope.operator import names
from frscope.operator.kube.api_client import Resource
from frscope.operator.model.jobset_restart import int_field, jobset_restart_refusal

# A pod's job, by family: the label that names it.
LABEL_PYTORCHJOB_NAME: Final = "training.kubeflow.org/job-name"
LABEL_PYTORCHJOB_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
LABEL_PYTORCHJOB_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"
LABEL_JOBSET_NAME: Final = "jobset.sigs.k8s.io/jobset-name"
LABEL_JOBSET_REPLICATED_JOB: Final = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_JOBSET_JOB_INDEX: Final = "jobset.sigs.k8s.io/job-index"
LABEL_JOB_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"

FAMILY_KUBEFLOW_V1: Final = "kubeflow-v1"
FAMILY_JOBSET: Final = "jobset"

# metav1.Condition's limits, as the API server validates them.
CONDITION_MESSAGE_MAX: Final = 32768


@dataclass(frozen=True, slots=True)
class JobKind:
    key: str  # the operator's --job-kind value, the chart's jobKinds.<key>, the metrics' job_kind label
    resource: Resource
    family: str  # which pod labels name the job (FAMILY_*)
    metav1_conditions: bool  # status.conditions are metav1.Condition (observedGeneration, no lastUpdateTime)
    failed_types: frozenset[str]  # condition types that mean the job failed
    restarting_types: frozenset[str]
    state_types: frozenset[str]  # the controller's own condition types (the last True one is the state)
    finished_types: frozenset[str]  # condition types that, True, mean the job has ended
    suspend_path: tuple[str, ...]  # the spec field that suspends the job (stop)
    controller: str  # who brings deleted pods back, as the Events name it

    @property
    def api_version(self) -> str:
        return self.resource.api_version

    @property
    def kind(self) -> str:
        return self.resource.kind

    @property
    def runs_on_jobset(self) -> bool:
        """The job's pods are a JobSet's: restarting is the JobSet controller's (the job itself, or the
        JobSet a TrainJob owns)."""
        return self.family == FAMILY_JOBSET

    @property
    def suspend_field(self) -> str:
        return ".".join(self.suspend_path)

    def pod_selector(self, job_name: str) -> str:
        """The label selector of the job's pods."""
        label = LABEL_PYTORCHJOB_NAME if self.family == FAMILY_KUBEFLOW_V1 else LABEL_JOBSET_NAME
        return f"{label}={job_name}"

    def suspended(self, job: Mapping[str, Any]) -> bool:
        value: Any = job
        for key in self.suspend_path:
            value = value.get(key) if isinstance(value, dict) else None
        return value is True

    def inactive(self, job: Mapping[str, Any]) -> str | None:
        """Why the job cannot be acted on any more (finished, suspended, being deleted), else None."""
        meta = job.get("metadata")
        if isinstance(meta, dict) and meta.get("deletionTimestamp"):
            return "the job is being deleted"
        if self.suspended(job):
            return f"the job is suspended ({self.suspend_field})"
        for c in _conditions(job):
            if c.get("type") in self.finished_types and c.get("status") == "True":
                return f"the job has {str(c.get('type')).lower()}"
        return None

    def restart_refusal(self, job: Mapping[str, Any], jobset: Mapping[str, Any] | None = None) -> str | None:
        """Why deleting every pod of the job would not bring it back, else None. For a kind that runs
        on a JobSet, `jobset` is that JobSet (the job itself for a bare JobSet)."""
        if not self.runs_on_jobset:
            return _pytorchjob_restart_refusal(job)
        if jobset is None:
            return "no JobSet runs the job (Trainer has not made it)"
        return jobset_restart_refusal(jobset)

    def stop_patch(self, uid: str, reason: str) -> dict[str, Any]:
        """The merge patch that stops the job for good (uid as a precondition), the verdict beside it."""
        value: dict[str, Any] = {self.suspend_path[-1]: True}
        for key in reversed(self.suspend_path[1:-1]):
            value = {key: value}
        return {"metadata": {"uid": uid, "annotations": {names.ANN_STOPPED: reason}}, self.suspend_path[0]: value}


PYTORCHJOB: Final = JobKind(
    key="pytorchjob",
    resource=Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"),
    family=FAMILY_KUBEFLOW_V1,
    metav1_conditions=False,
    failed_types=frozenset({"Failed"}),
    restarting_types=frozenset({"Restarting"}),
    state_types=frozenset({"Failed", "Restarting", "Running", "Succeeded", "Created"}),
    finished_types=frozenset({"Succeeded", "Failed"}),
    suspend_path=("spec", "runPolicy", "suspend"),
    controller="the training operator",
)
TRAINJOB: Final = JobKind(
    key="trainjob",
    resource=Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"),
    family=FAMILY_JOBSET,
    metav1_conditions=True,
    failed_types=frozenset({"Failed"}),
    restarting_types=frozenset(),
    state_types=frozenset({"Failed", "Complete", "Suspended"}),  # Trainer v2.3.0 writes these three
    finished_types=frozenset({"Complete", "Failed"}),
    suspend_path=("spec", "suspend"),
    controller="the JobSet and Job controllers",
)
JOBSET: Final = JobKind(
    key="jobset",
    resource=Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet"),
    family=FAMILY_JOBSET,
    metav1_conditions=True,
    failed_types=frozenset({"Failed"}),
    restarting_types=frozenset(),
    state_types=frozenset({"Failed", "Completed", "Suspended", "StartupPolicyCompleted", "StartupPolicyInProgress"}),
    finished_types=frozenset({"Completed", "Failed"}),
    suspend_path=("spec", "suspend"),
    controller="the JobSet and Job controllers",
)

ALL: Final = (PYTORCHJOB, TRAINJOB, JOBSET)
KEYS: Final = tuple(k.key for k in ALL)
_BY_KIND: Final = {k.kind: k for k in ALL}
_BY_KEY: Final = {k.key: k for k in ALL}


def by_kind(kind: str) -> JobKind:
    """The JobKind of an object's `kind` (PyTorchJob when unknown: the operator's original kind)."""
    return _BY_KIND.get(kind, PYTORCHJOB)


def find(kind: str) -> JobKind | None:
    """The JobKind of an object's `kind`, None when it is none of them."""
    return _BY_KIND.get(kind)


def kueue_queue(job: Mapping[str, Any]) -> str | None:
    """The Kueue LocalQueue that admits the job (label kueue.x-k8s.io/queue-name), if any."""
    meta = job.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    queue = labels.get(names.LABEL_KUEUE_QUEUE) if isinstance(labels, dict) else None
    return str(queue) if queue else None


def _conditions(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = job.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return [c for c in conditions or [] if isinstance(c, dict)]


def _pytorchjob_restart_refusal(job: Mapping[str, Any]) -> str | None:
    spec = job.get("spec")
    replicas = spec.get("pytorchReplicaSpecs") if isinstance(spec, dict) else None
    never = sorted(str(rtype) for rtype, rs in (replicas.items() if isinstance(replicas, dict) else [])
                   if isinstance(rs, dict) and rs.get("restartPolicy") == "Never")
    if never:
        return (f"replica type(s) {', '.join(never)} have restartPolicy Never: the training operator would "
                "mark the job Failed instead of recreating its pods")
    return None


def parse_keys(values: Iterable[str]) -> tuple[JobKind, ...]:
    """`pytorchjob,trainjob` (repeatable, comma-separated) -> the kinds, in the canonical order."""
    wanted: set[str] = set()
    for value in values:
        for part in str(value).split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part not in _BY_KEY:
                raise ValueError(f"unknown job kind {part!r}; known: {', '.join(KEYS)}")
            wanted.add(part)
    if not wanted:
        raise ValueError(f"no job kind enabled; known: {', '.join(KEYS)}")
    return tuple(k for k in ALL if k.key in wanted)


@dataclass(frozen=True, slots=True)
class PodJob:
    """Which job a pod belongs to, read off its labels."""

    family: str
    job_name: str
    replica_type: str  # Master/Worker, or the JobSet's replicated-job name ('node' for Trainer)
    replica_index: int | None  # PyTorchJob's replica index, or the JobSet's job index


def _index(text: object) -> int | None:
    value = str(text) if text is not None else ""
    return int(value) if value.isdigit() else None


def pod_job(labels: Mapping[str, Any]) -> PodJob | None:
    name = labels.get(LABEL_PYTORCHJOB_NAME)
    if name:
        return PodJob(FAMILY_KUBEFLOW_V1, str(name), str(labels.get(LABEL_PYTORCHJOB_REPLICA_TYPE) or ""),
                      _index(labels.get(LABEL_PYTORCHJOB_REPLICA_INDEX)))
    name = labels.get(LABEL_JOBSET_NAME)
    if name:
        index = _index(labels.get(LABEL_JOBSET_JOB_INDEX))
        if index is None:
            index = _index(labels.get(LABEL_JOB_COMPLETION_INDEX))
        return PodJob(FAMILY_JOBSET, str(name), str(labels.get(LABEL_JOBSET_REPLICATED_JOB) or ""), index)
    return None


def owned_by_trainjob(job: Mapping[str, Any]) -> bool:
    """A JobSet that Trainer made for a TrainJob (diagnosed as the TrainJob, never on its own)."""
    meta = job.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    return any(isinstance(r, dict) and r.get("kind") == TRAINJOB.kind
               and str(r.get("apiVersion") or "").startswith(TRAINJOB.resource.group + "/")
               for r in refs or [])


def _nproc_from_env(containers: Iterable[Any]) -> int | None:
    """PET_NPROC_PER_NODE of the first container that sets it as a number."""
    for container in containers:
        if not isinstance(container, dict):
            continue
        for env in container.get("env") or []:
            if isinstance(env, dict) and env.get("name") == "PET_NPROC_PER_NODE":
                return int_field(env.get("value"))
    return None


def _env_int(container: Mapping[str, Any], name: str) -> int | None:
    for env in container.get("env") or []:
        if isinstance(env, dict) and env.get("name") == name:
            return int_field(env.get("value"))
    return None


def pod_world_size(containers: Iterable[Any]) -> int | None:
    """PET_NNODES x PET_NPROC_PER_NODE of a pod's torchrun container (Trainer sets both as values;
    'auto' or a value from elsewhere: None). What a TrainJob whose runtime holds numNodes does not say."""
    for container in containers:
        if isinstance(container, dict):
            nodes, nproc = _env_int(container, "PET_NNODES"), _env_int(container, "PET_NPROC_PER_NODE")
            if nodes and nproc:
                return nodes * nproc
    return None


def world_size(kind: JobKind, job: Mapping[str, Any]) -> int | None:
    """How many ranks the spec says, when it says it as numbers; else None (the sidecars then tell)."""
    spec = job.get("spec")
    if not isinstance(spec, dict):
        return None
    if kind is PYTORCHJOB:
        return _pytorchjob_world_size(spec)
    if kind is TRAINJOB:
        trainer = spec.get("trainer")
        if not isinstance(trainer, dict):
            return None  # numNodes and numProcPerNode come from the runtime: known only in the pods
        nodes, nproc = int_field(trainer.get("numNodes")), int_field(trainer.get("numProcPerNode"))
        return nodes * nproc if nodes and nproc else None
    total = 0
    for rjob in spec.get("replicatedJobs") or []:
        if not isinstance(rjob, dict):
            return None
        replicas = int_field(rjob.get("replicas", 1))
        jspec = (rjob.get("template") or {}).get("spec") or {}
        parallelism = int_field(jspec.get("parallelism", 1)) if isinstance(jspec, dict) else None
        pod_spec = ((jspec.get("template") or {}).get("spec") or {}) if isinstance(jspec, dict) else {}
        nproc = _nproc_from_env(pod_spec.get("containers") or []) if isinstance(pod_spec, dict) else None
        if replicas is None or parallelism is None or nproc is None:
            return None  # a replicated job without torchrun's env (an initializer) or with 'auto'
        total += replicas * parallelism * nproc
    return total or None


def _pytorchjob_world_size(spec: Mapping[str, Any]) -> int | None:
    replica_specs = spec.get("pytorchReplicaSpecs")
    if not isinstance(replica_specs, dict):
        return None
    replicas = 0
    for rs in replica_specs.values():
        count = rs.get("replicas", 1) if isinstance(rs, dict) else None
        if not isinstance(count, int):
            return None
        replicas += count
    nproc: Any = spec.get("nprocPerNode")
    elastic = spec.get("elasticPolicy")
    if nproc is None and isinstance(elastic, dict):
        nproc = elastic.get("nProcPerNode")
    if nproc is None:
        nproc = 1
    try:
        per_node = int(str(nproc))
    except ValueError:
        return None  # 'auto', 'gpu', 'cpu': known only inside the pod
    return replicas * per_node if replicas and per_node > 0 else None
