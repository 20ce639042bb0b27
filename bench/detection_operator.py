#!/usr/bin/env python3
"""Detection end to end: hang start -> the suspected condition on the job, through the operator and
the real API server, with the chart's defaults.

What it runs: the real kube-apiserver + etcd from testenv (PyTorchJob and FlightRecorderReport CRDs),
one `frscope operator` process with its defaults (a status sweep every 15 s, the default gather and
analysis; `--sidecar-auth token` with a shared secret instead of service-account tokens, which no
kubelet can project here), and per hang a real 4-rank gloo job (frscope.testing.rhythm_job through
the zero-code bootstrap) in 2 pods of 2 ranks, each pod with a real `frscope sidecar` at its defaults
pushing to the operator (the chart's pushToOperator). Pods are API objects patched Running with the
sidecar's loopback address, as in tests/e2e (no kubelet). At a random step about 25-30 s in a random
rank stops in a Python function at a random point of its compute; measured from that moment (the
rank writes it) to the job's frscope condition with status Unknown naming that rank, read from the
API server every 0.25 s.

    .venv/bin/python bench/detection_operator.py                 # 12 hangs, writes bench/RESULTS.md
    .venv/bin/python bench/detection_operator.py --hangs 2 --results /tmp/d.md

Only the "### Through the operator" subsection of "## Detection" is written; the rest is kept.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from frscope.testing.rhythm_launch import start_rhythm_job  # noqa: E402

SECTION = "## Detection"
SUBSECTION = "### Through the operator"
CONDITION = "CollectiveTimeoutDiagnosed"
NAMESPACE = "bench"


def load_cluster() -> Any:
    spec = importlib.util.spec_from_file_location("frscope_testenv_cluster", REPO / "testenv" / "cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def bin_dir() -> Path:
    proc = subprocess.run([str(REPO / "testenv" / "build"), "--check"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit("testenv is not built: run `make testenv` (the bench needs the real API server)")
    return Path(proc.stdout.strip().splitlines()[-1])


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def make_job(plane: Any, name: str) -> str:
    template = {"spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]}}
    job = plane.apply({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"nprocPerNode": "2", "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
            "Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}},
    })
    conditions = [{"type": t, "status": "True", "reason": f"PyTorchJob{t}", "message": f"PyTorchJob {name} is {t}.",
                   "lastUpdateTime": now(), "lastTransitionTime": now()} for t in ("Created", "Running")]
    plane.kubectl("patch", "pytorchjob", name, "-n", NAMESPACE, "--subresource=status", "--type=merge",
                  "-p", json.dumps({"status": {"conditions": conditions}}))
    return str(job["metadata"]["uid"])


def make_pod(plane: Any, job: str, uid: str, name: str, replica: str, port: int) -> None:
    plane.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {
            "frscope.io/inject": "true", "training.kubeflow.org/job-name": job,
            "training.kubeflow.org/replica-type": replica,
            "training.kubeflow.org/replica-index": "0", "training.kubeflow.org/operator-name": "pytorchjob-controller"},
            "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job, "uid": uid,
                                 "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"initContainers": [{"name": "frscope-sidecar", "image": "frscope:bench", "restartPolicy": "Always",
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


def condition(plane: Any, job: str) -> dict[str, Any] | None:
    body = plane.get_raw(f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/pytorchjobs/{job}")
    found = [c for c in (body.get("status") or {}).get("conditions", []) if c.get("type") == CONDITION]
    return found[0] if found else None


def run_hang(plane: Any, index: int, step_s: float, seed: int, work: Path, op_url: str, token: Path) -> dict[str, Any]:
    """One hang; a job whose rank 0 lost the race for its free port (EADDRINUSE) is started again."""
    for attempt in range(3):
        try:
            return run_hang_once(plane, index, step_s, seed, work, op_url, token, attempt)
        except RuntimeError as exc:
            if "exited early" not in str(exc) or attempt == 2:
                raise
            print(f"hang {index}: the job did not start ({str(exc)[-120:]}); again", flush=True)
    raise AssertionError("unreachable")


def run_hang_once(plane: Any, index: int, step_s: float, seed: int, work: Path, op_url: str, token: Path,
                  attempt: int) -> dict[str, Any]:
    rng = random.Random(seed)
    culprit = rng.randrange(4)
    name = f"train-{index}" + (f"-{attempt}" if attempt else "")
    args = ["--steps", "100000", "--step-s", str(step_s), "--jitter-s", str(step_s / 10), "--culprit", str(culprit),
            "--hang-step", str(max(6, int(25 / step_s)) + rng.randint(0, 5)), "--seed", str(seed)]
    result: dict[str, Any] = {"step_s": step_s, "culprit": culprit, "suspected_s": None, "note": ""}
    pods = {0: f"{name}-master-0", 1: f"{name}-worker-0"}
    sidecars: list[subprocess.Popen[bytes]] = []
    with start_rhythm_job(4, 2, args, lifetime_s=300) as job:
        job.wait_for_sockets(180)
        try:
            uid = make_job(plane, name)
            for index_, pod in pods.items():
                port_file = work / f"{pod}.port"
                log = open(work / f"{pod}.log", "wb")  # the child holds it; closed with the process's end
                sidecars.append(subprocess.Popen(
                    [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(job.pods[index_]),
                     "--evidence-dir", "none", "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
                     "--pod", pod, "--namespace", NAMESPACE, "--operator-url", op_url, "--token-file", str(token)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO))
                log.close()
                deadline = time.monotonic() + 90
                while not (port_file.exists() and port_file.read_text().strip()):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sidecar of {pod} did not start")
                    time.sleep(0.1)
                make_pod(plane, name, uid, pod, "master" if index_ == 0 else "worker", int(port_file.read_text()))
            hang_ns = None
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                hang_ns = hang_ns or job.hang_started_ns()
                found = condition(plane, name)
                if found is not None and found.get("status") in ("Unknown", "True"):
                    if hang_ns is None:
                        result["note"] = f"a condition before the hang: {found.get('message')}"
                        break
                    result["suspected_s"] = (time.time_ns() - hang_ns) / 1e9
                    result["status"] = found.get("status")
                    result["named"] = f"Rank {culprit} " in str(found.get("message"))
                    result["message"] = str(found.get("message"))[:200]
                    break
                if hang_ns is not None and time.time_ns() - hang_ns > 120e9:
                    result["note"] = "no condition within 120 s"
                    break
                time.sleep(0.25)
        finally:
            for proc in sidecars:
                stop(proc)
    print(f"hang {index}: step {step_s:g} s, culprit {culprit}: {result}", flush=True)
    return result


def write_subsection(path: Path, text: str, subsection: str = SUBSECTION) -> None:
    """Put `text` (starting with `subsection`) at the end of the "## Detection" section, replacing an
    earlier one; the rest of the file is kept."""
    previous = path.read_text() if path.exists() else ""
    if SECTION not in previous:
        path.write_text(previous.rstrip("\n") + f"\n\n{SECTION}\n\n{text}")
        return
    head, rest = previous.split(SECTION, 1)
    nxt = rest.find("\n## ")
    body, tail = (rest[:nxt], rest[nxt:]) if nxt >= 0 else (rest, "")
    if subsection in body:
        before, after = body.split(subsection, 1)
        later = after.find("\n### ")
        body = before + (after[later + 1:] if later >= 0 else "")
    path.write_text(head + SECTION + body.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n" + tail)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hangs", type=int, default=12)
    parser.add_argument("--step-periods", default="0.1,0.25,0.5,1,2,5")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--results", default=str(REPO / "bench" / "RESULTS.md"))
    args = parser.parse_args()
    # Ctrl-C (or SIGINT to a run started in the background, which inherits it ignored) ends the run
    # through its cleanup: ranks, sidecars, the operator and the control plane are stopped.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    periods = [float(p) for p in args.step_periods.split(",")]
    cluster = load_cluster()
    work = Path(tempfile.mkdtemp(prefix="frscope-detect-op-"))
    token = work / "token"
    token.write_text(secrets.token_hex(16))
    plane = cluster.start(bin_dir(), crds=[], controller_manager=False)
    op: subprocess.Popen[bytes] | None = None
    started = time.monotonic()
    try:
        crd_dir = bin_dir().parent / "crds"
        for crd in [*sorted(crd_dir.glob("kubeflow.org_pytorchjobs.yaml")),
                    REPO / "charts/frscope/crds/flightrecorderreport.yaml"]:
            plane.kubectl("apply", "-f", str(crd))
        plane.kubectl("create", "namespace", NAMESPACE)
        plane.kubectl("create", "serviceaccount", "default", "-n", NAMESPACE)
        time.sleep(3)
        http_port = cluster.free_port()
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
        op_log = open(work / "operator.log", "wb")  # the child holds it
        op = subprocess.Popen([sys.executable, "-m", "frscope", "operator", "--http-host", "127.0.0.1", "--http-port",
                               str(http_port), "--sidecar-auth", "token", "--sidecar-token-file", str(token)],
                              env=env, stdout=op_log, stderr=subprocess.STDOUT, cwd=REPO)
        op_log.close()
        time.sleep(5)
        results = [run_hang(plane, i, periods[i % len(periods)], args.seed * 100 + i, work,
                            f"http://127.0.0.1:{http_port}", token) for i in range(args.hangs)]
    finally:
        if op is not None:
            stop(op)
        plane.stop()
    got = [r["suspected_s"] for r in results if r["suspected_s"] is not None]
    command = " ".join(["python bench/detection_operator.py", *sys.argv[1:]])
    lines = [f"{SUBSECTION}: hang -> suspected condition on the job", "",
             f"Command: `{command}` ({(time.monotonic() - started) / 60:.1f} min wall; one hang at a time; the "
             "operator and sidecars at their defaults, sidecars pushing; the machine's 2 cores shared with other "
             "work)", "",
             "| step period | runs | hang -> condition Unknown naming the culprit p50 / p90 / max (s) |",
             "|---|---|---|"]
    for step in sorted({r["step_s"] for r in results}):
        mine = [r["suspected_s"] for r in results if r["step_s"] == step and r["suspected_s"] is not None]
        shown = f"{pct(mine, .5):.1f} / {pct(mine, .9):.1f} / {max(mine):.1f}" if mine else "-"
        lines.append(f"| {step:g} s | {sum(1 for r in results if r['step_s'] == step)} | {shown} |")
    if got:
        lines.append(f"| all | {len(results)} | {pct(got, .5):.1f} / {pct(got, .9):.1f} / {max(got):.1f} |")
    named = sum(1 for r in results if r.get("named"))
    lines += ["", f"The condition named the stuck rank in {named} of {len(results)} hangs; status Unknown (suspected) "
              f"in {sum(1 for r in results if r.get('status') == 'Unknown')}."]
    missed = [r for r in results if r["suspected_s"] is None or not r.get("named")]
    for r in missed:
        lines.append(f"- step {r['step_s']:g} s, rank {r['culprit']}: {r['note'] or r.get('message')}")
    text = "\n".join(lines) + "\n"
    print(text)
    write_subsection(Path(args.results), text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
