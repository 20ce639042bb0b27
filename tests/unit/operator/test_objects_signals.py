"""Reading jobs and pods into typed views, and the signals read off them (pure functions)."""

from __future__ import annotations

from frscope.operator.model.objects import JobKey, dns_name, job_world_size, pod_info, pods_digest
from frscope.operator.model.signals import SignalKind, job_condition_signal, watchdog_match, watchdog_signals
from tests.unit.operator import builders


def test_pod_endpoint_from_ip_and_named_port() -> None:
    info = pod_info(builders.pod("train-worker-0", ip="10.1.2.3", port=9402))
    assert info.endpoint == "http://10.1.2.3:9402"
    assert info.job_name == "train" and info.replica_type == "worker" and info.replica_index == 0
    assert pod_info(builders.pod("p", ip=None)).endpoint is None
    assert pod_info(builders.pod("p", port=None)).endpoint is None
    # A plain-container sidecar (no native sidecar support) is found too, and IPv6 is bracketed.
    assert pod_info(builders.pod("p", native=False, ip="fd00::1")).endpoint == "http://[fd00::1]:9402"


def test_runs_and_terminations() -> None:
    # Killed by the watchdog in run 0, restarted by the kubelet: the termination belongs to run 0.
    info = pod_info(builders.pod("p", restarts=1, last_state=builders.terminated(builders.WATCHDOG_MESSAGE)))
    assert info.run == 1
    assert [(t.run, t.exit_code) for t in info.terminations] == [(0, 134)]
    # Ended for good (restartPolicy Never): the termination is the current run.
    info = pod_info(builders.pod("p", restarts=0, state=builders.terminated("boom", 1)))
    assert [(t.run, t.message) for t in info.terminations] == [(0, "boom")]


def test_watchdog_messages_nccl_and_gloo() -> None:
    assert watchdog_match(builders.WATCHDOG_MESSAGE) == (True, "0", 812)
    gloo = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
            "Timed out waiting 1800000ms for recv operation to complete")
    assert watchdog_match(gloo) == (True, None, None)
    assert watchdog_match("Traceback ... ValueError: bad batch")[0] is False
    assert watchdog_match("")[0] is False


def test_watchdog_signal_names_run_group_and_seq() -> None:
    info = pod_info(builders.pod("train-worker-0", restarts=1,
                                 last_state=builders.terminated(builders.WATCHDOG_MESSAGE)))
    [sig] = watchdog_signals(info)
    assert sig.kind is SignalKind.WATCHDOG_TIMEOUT
    assert (sig.job, sig.pod, sig.run, sig.group, sig.seq) == (JobKey("ml", "train"), "train-worker-0", 0, "0", 812)
    assert watchdog_signals(pod_info(builders.pod("p", state=builders.terminated("OOM", 137)))) == []


def test_job_condition_signal_reads_the_latest_state_only() -> None:
    key = JobKey("ml", "train")
    failed = [{"type": "Created", "status": "True"}, {"type": "Running", "status": "False"},
              {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed"}]
    assert job_condition_signal(key, failed).kind is SignalKind.JOB_FAILED  # type: ignore[union-attr]
    restarting = [{"type": "Created", "status": "True"}, {"type": "Restarting", "status": "True"}]
    assert job_condition_signal(key, restarting).kind is SignalKind.JOB_RESTARTING  # type: ignore[union-attr]
    running = [{"type": "CollectiveTimeoutDiagnosed", "status": "True"}, {"type": "Created", "status": "True"},
               {"type": "Running", "status": "True"}]
    assert job_condition_signal(key, running) is None
    # frscope's own condition is never read as the job's state.
    assert job_condition_signal(key, [{"type": "CollectiveTimeoutDiagnosed", "status": "True"}]) is None


def test_world_size_from_the_spec() -> None:
    assert job_world_size(builders.job(workers=3, nproc=2)) == 8
    assert job_world_size(builders.job(workers=3, nproc="4")) == 16
    assert job_world_size(builders.job(workers=1, nproc="auto")) is None


def test_pods_digest_changes_with_new_pods_only() -> None:
    a = [pod_info(builders.pod("p0")), pod_info(builders.pod("p1"))]
    assert pods_digest(a) == pods_digest(list(reversed(a)))
    assert pods_digest(a) != pods_digest([a[0], pod_info(builders.pod("p1", uid="new"))])


def test_dns_name_is_valid_and_unique_when_cut() -> None:
    assert dns_name("Train_Job", "ab12") == "train-job-ab12"
    long_a, long_b = dns_name("x" * 300, "a"), dns_name("x" * 300, "b")
    assert len(long_a) <= 63 and long_a != long_b
