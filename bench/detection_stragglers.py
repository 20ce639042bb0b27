#!/usr/bin/env python3
"""Stragglers across pods, end to end: a rank alone in its pod computing 1.2, 1.5 or 2 x as long as the
others -> the operator's `Straggler` Event on the job naming that rank and its pod; and healthy
multi-pod jobs (long pauses, evaluation phases, 30% jitter), where any `Straggler` Event is false.

What it runs: the real kube-apiserver + etcd from testenv (PyTorchJob and FlightRecorderReport CRDs),
one `frscope operator` process with its defaults (a status sweep every 15 s; `--sidecar-auth token`
with a shared secret, as bench/detection_operator.py), and per job a real gloo job
(frscope.testing.rhythm_job through the zero-code bootstrap) of one rank per pod, each pod with a real
`frscope sidecar` at its defaults (a probe every 2 s, the full recorder every 30 s). Pods are API
objects patched Running with the sidecar's loopback address and a node name of their own, as in
tests/e2e (no kubelet). Gloo dates enqueues only, so this is the comparison by clocks (each pod's
offset measured by the operator; all pods share this host's clock).
  - stragglers: 3 pods of one rank, steps of 0.25, 0.5 or 1 s with 10% jitter; about 30 s in, one
    rank computes --factor x as long. Measured from its first slow step (the rank writes it) to the
    Event naming it, read from the API server every second; an Event naming another rank is wrong.
  - healthy: 4 pods of one rank, steps of 0.25 and 1 s with 30% jitter, checkpoints of 30-45 s
    every ~60 s (every rank), evaluation phases, for --healthy-minutes each, beside the straggler runs.

    .venv/bin/python bench/detection_stragglers.py                       # writes bench/RESULTS.md
    .venv/bin/python bench/detection_stragglers.py --runs 3 --healthy-minutes 3 --results /tmp/d.md

Only the "### Stragglers across pods" subsection of "## Detection" is written; the rest is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from detection_operator import NAMESPACE, bin_dir, load_cluster, now, pct, stop, write_subsection  # noqa: E402

from frscope.testing.rhythm_launch import RhythmJob, start_rhythm_job  # noqa: E402

SECTION = "## Detection"
SUBSECTION = "### Stragglers across pods"


def make_job(plane: Any, name: str, pods: int) -> str:
    template = {"spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]}}
    job = plane.apply({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"nprocPerNode": "1", "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
            "Worker": {"replicas": pods - 1, "restartPolicy": "OnFailure", "template": template}}},
    })
    conditions = [{"type": t, "status": "True", "reason": f"PyTorchJob{t}", "message": f"PyTorchJob {name} is {t}.",
                   "lastUpdateTime": now(), "lastTransitionTime": now()} for t in ("Created", "Running")]
    plane.kubectl("patch", "pytorchjob", name, "-n", NAMESPACE, "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": {"conditions": conditions}}))
    return str(job["metadata"]["uid"])


def pod_name(job: str, index: int) -> str:
    return f"{job}-master-0" if index == 0 else f"{job}-worker-{index - 1}"


def make_pod(plane: Any, job: str, uid: str, index: int, port: int) -> None:
    replica, replica_index = ("master", 0) if index == 0 else ("worker", index - 1)
    name = pod_name(job, index)
    plane.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {
            "frscope.io/inject": "true", "training.kubeflow.org/job-name": job,
            "training.kubeflow.org/replica-type": replica, "training.kubeflow.org/replica-index": str(replica_index),
            "training.kubeflow.org/operator-name": "pytorchjob-controller"},
            "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job, "uid": uid,
                                 "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"nodeName": f"{job}-node-{index}",
                 "initContainers": [{"name": "frscope-sidecar", "image": "frscope:bench", "restartPolicy": "Always",
                                     "ports": [{"name": "frscope", "containerPort": port}]}],
                 "containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]},
    })
    running = {"running": {"startedAt": now()}}
    plane.kubectl("patch", "pod", name, "-n", NAMESPACE, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "hostIP": "127.0.0.1",
                    "startTime": now(),
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now()}],
                    "initContainerStatuses": [{"name": "frscope-sidecar", "image": "frscope:bench", "imageID": "",
                                               "ready": True, "restartCount": 0, "started": True, "state": running}],
                    "containerStatuses": [{"name": "pytorch", "image": "registry.invalid/train:1", "imageID": "",
                                           "ready": True, "restartCount": 0, "started": True, "state": running}]}}))


def straggler_events(plane: Any, job: str) -> list[dict[str, Any]]:
    body = plane.get_raw(f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.name%3D{job}")
    return [e for e in body.get("items", []) if e.get("reason") == "Straggler"]


class Deployed:
    """A rhythm job's pods as API objects, each with a real sidecar pushing to the operator."""

    def __init__(self, plane: Any, name: str, job: RhythmJob, pods: int, work: Path, op_url: str,
                 token: Path) -> None:
        self.sidecars: list[subprocess.Popen[bytes]] = []
        uid = make_job(plane, name, pods)
        for index in range(pods):
            pod = pod_name(name, index)
            port_file = work / f"{pod}.port"
            log = open(work / f"{pod}.log", "wb")  # the child holds it; closed with the process's end
            self.sidecars.append(subprocess.Popen(
                [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(job.pods[index]),
                 "--evidence-dir", "none", "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
                 "--pod", pod, "--namespace", NAMESPACE, "--operator-url", op_url, "--token-file", str(token)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO))
            log.close()
            deadline = time.monotonic() + 90
            while not (port_file.exists() and port_file.read_text().strip()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sidecar of {pod} did not start")
                time.sleep(0.1)
            make_pod(plane, name, uid, index, int(port_file.read_text()))

    def stop(self) -> None:
        for proc in self.sidecars:
            stop(proc)


@dataclass
class StragglerRun:
    factor: float
    step_s: float
    culprit: int
    named_s: float | None = None
    wrong: list[str] = field(default_factory=list)
    message: str = ""


def run_straggler(plane: Any, index: int, factor: float, step_s: float, seed: int, work: Path, op_url: str,
                  token: Path) -> StragglerRun:
    rng = random.Random(seed)
    culprit = rng.randrange(3)
    run = StragglerRun(factor, step_s, culprit)
    name = f"slow-{index}"
    args = ["--steps", "100000", "--step-s", str(step_s), "--jitter-s", str(step_s / 10), "--culprit", str(culprit),
            "--slow-factor", str(factor), "--slow-from-step", str(int(30 / step_s)), "--seed", str(seed)]
    with start_rhythm_job(3, 1, args, lifetime_s=400) as job:
        job.wait_for_sockets(180)
        deployed = Deployed(plane, name, job, 3, work, op_url, token)
        try:
            deadline = time.monotonic() + 330
            while time.monotonic() < deadline:
                started = job.slow_started_ns()
                for event in straggler_events(plane, name):
                    message = str(event.get("message"))
                    if message.startswith(f"rank {culprit} (pod {pod_name(name, culprit)}") and started is not None:
                        run.named_s = run.named_s or (time.time_ns() - started) / 1e9
                        run.message = run.message or message
                    elif message not in run.wrong:
                        run.wrong.append(message)
                if run.named_s is not None:
                    break
                if started is not None and time.time_ns() - started > 180e9:
                    break
                time.sleep(1.0)
        finally:
            deployed.stop()
    print(f"straggler {index}: {factor:g} x, step {step_s:g} s, rank {culprit}: named after {run.named_s} s "
          f"({run.message[:160]}); wrong {run.wrong}", flush=True)
    return run


@dataclass
class HealthyRun:
    step_s: float
    minutes: float
    false: list[str] = field(default_factory=list)


def run_healthy(plane: Any, index: int, step_s: float, minutes: float, seed: int, work: Path, op_url: str,
                token: Path) -> HealthyRun:
    run = HealthyRun(step_s, minutes)
    name = f"healthy-{index}"
    every = max(5, int(60 / (step_s * 1.15)))
    args = ["--steps", "1000000", "--step-s", str(step_s), "--jitter-s", str(step_s * 0.3), "--pause-every",
            str(every), "--pause-s", "30", "--pause-max-s", "45", "--eval-every", str(max(3, every // 2 + 1)),
            "--eval-steps", "10", "--seed", str(seed)]
    with start_rhythm_job(4, 1, args, lifetime_s=minutes * 60 + 300) as job:
        job.wait_for_sockets(180)
        deployed = Deployed(plane, name, job, 4, work, op_url, token)
        try:
            time.sleep(minutes * 60)
            run.false = [str(e.get("message")) for e in straggler_events(plane, name)]
            assert all(job.alive(r) for r in job.ranks()), job.log_tail(0)
        finally:
            deployed.stop()
    print(f"healthy {step_s:g} s x {minutes:g} min: {len(run.false)} Straggler Events {run.false}", flush=True)
    return run


def summary(stragglers: list[StragglerRun], healthy: list[HealthyRun], command: str, wall_s: float) -> str:
    lines = [f"{SUBSECTION}: a slow rank alone in its pod -> the operator's Straggler Event", "",
             f"Command: `{command}` ({wall_s / 60:.1f} min wall; the operator and sidecars at their defaults; "
             "one straggler job at a time, the healthy jobs beside them; the machine's 2 cores shared with other "
             "work)", "",
             "| factor | step periods | runs | slow -> Event naming the rank p50 / max (s) | not named within 180 s "
             "| Events naming another rank |", "|---|---|---|---|---|---|"]
    for factor in sorted({r.factor for r in stragglers}):
        runs = [r for r in stragglers if r.factor == factor]
        got = [r.named_s for r in runs if r.named_s is not None]
        shown = f"{pct(got, .5):.1f} / {max(got):.1f}" if got else "-"
        steps = ", ".join(f"{s:g}" for s in sorted({r.step_s for r in runs}))
        lines.append(f"| {factor:g} x | {steps} s | {len(runs)} | {shown} | "
                     f"{sum(1 for r in runs if r.named_s is None)} | {sum(len(r.wrong) for r in runs)} |")
    lines += ["", "Healthy jobs (4 pods of one rank, 30% jitter, 30-45 s checkpoints, evaluation phases): "
              + ", ".join(f"{h.step_s:g} s steps x {h.minutes:g} min: {len(h.false)} Straggler Events" for h in healthy)
              + "."]
    right = sum(1 for r in stragglers if r.named_s is not None)
    wrong = sum(len(r.wrong) for r in stragglers) + sum(len(h.false) for h in healthy)
    if right + wrong:
        share = 100 * right / (right + wrong)
        lines += ["", f"Precision: {right} right of {right + wrong} Straggler Events ({share:.0f}%)."]
    examples = [r.message for r in stragglers if r.message][:1]
    for message in examples:
        lines += ["", f"An Event: `{message}`"]
    for r in stragglers:
        for message in r.wrong:
            lines.append(f"- wrong, {r.factor:g} x at {r.step_s:g} s, rank {r.culprit} slow: {message}")
    for h in healthy:
        for message in h.false:
            lines.append(f"- false, healthy {h.step_s:g} s: {message}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=9, help="straggler runs (factors 1.2, 1.5, 2 in turn)")
    parser.add_argument("--healthy-minutes", type=float, default=12.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--results", default=str(REPO / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cluster = load_cluster()
    work = Path(tempfile.mkdtemp(prefix="frscope-detect-slow-"))
    token = work / "token"
    token.write_text(secrets.token_hex(16))
    plane = cluster.start(bin_dir(), crds=[], controller_manager=False)
    op: subprocess.Popen[bytes] | None = None
    started = time.monotonic()
    healthy: list[HealthyRun] = []
    try:
        crd_dir = bin_dir().parent / "crds"
        for crd in [*sorted(crd_dir.glob("kubeflow.org_pytorchjobs.yaml")),
                    REPO / "charts/frscope/crds/flightrecorderreport.yaml"]:
            plane.kubectl("apply", "-f", str(crd))
        plane.kubectl("create", "namespace", NAMESPACE)
        plane.kubectl("create", "serviceaccount", "default", "-n", NAMESPACE)
        time.sleep(3)
        http_port = cluster.free_port()
        op_url = f"http://127.0.0.1:{http_port}"
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
        op_log = open(work / "operator.log", "wb")  # the child holds it
        op = subprocess.Popen([sys.executable, "-m", "frscope", "operator", "--http-host", "127.0.0.1", "--http-port",
                               str(http_port), "--sidecar-auth", "token", "--sidecar-token-file", str(token)],
                              env=env, stdout=op_log, stderr=subprocess.STDOUT, cwd=REPO)
        op_log.close()
        time.sleep(5)
        threads = [threading.Thread(target=lambda i=i, s=s: healthy.append(
            run_healthy(plane, i, s, args.healthy_minutes, args.seed + i, work, op_url, token)))
            for i, s in enumerate((0.25, 1.0))] if args.healthy_minutes > 0 else []
        for thread in threads:
            thread.start()
        factors, steps = (1.2, 1.5, 2.0), (0.25, 0.5, 1.0)
        stragglers = [run_straggler(plane, i, factors[i % 3], steps[(i // 3) % 3], args.seed * 100 + i, work, op_url,
                                    token) for i in range(args.runs)]
        for thread in threads:
            thread.join()
    finally:
        if op is not None:
            stop(op)
        plane.stop()
    command = " ".join(["python bench/detection_stragglers.py", *sys.argv[1:]])
    text = summary(stragglers, healthy, command, time.monotonic() - started)
    print(text)
    write_subsection(Path(args.results), text, SUBSECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
