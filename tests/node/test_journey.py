"""The user's whole journey on a real node, as README's install section describes it; nothing is
patched by hand.

1. `helm install` the chart from the node's OCI registry (`oci://10.213.0.1:5000/charts/frscope`: the
   chart `helm push`ed and the image, built from the Dockerfile, `buildah push`ed there when the node
   started; TLS with a CA the node's containerd trusts) into frscope-system with the webhook on, only
   the image's repository set; the kubelet pulls the operator's image from the registry and the pod
   becomes Ready. `helm test` (the chart's test hook) passes: the operator answers through its Service
   and its webhook serves TLS that the chart's CA verifies and injects an opted-in pod.
2. A PyTorchJob (Master 1 + Worker 1, torchrun with 2 processes each, or plain python with one; gloo
   on CPU), its pod templates
   labelled `frscope.io/inject: "true"`, its script without any frscope code. The Kubeflow training
   operator makes the pods, Services and env; the API server sends the pods to the webhook through
   its Service over the chart's TLS; the kubelet pulls the sidecar's image from the registry and
   starts the injected native sidecar first.
3. One rank gets stuck in `load_batch`; `kubectl describe pytorchjob` shows frscope's condition and
   the Event naming rank, group, collective and the function; the report is owned by the job; the
   training operator's conditions and STATE stay as they are.
4. A real Prometheus (Debian's) scrapes the sidecars at their pod IPs with the chart's PodMonitor
   relabelling; the dashboard's stall query returns the ranks that wait on the stuck one.
5. Deleting the job removes its pods and the report.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.node.support import (
    CHART,
    CHART_SETS,
    CONDITION,
    LAUNCHERS,
    RELEASE,
    SYSTEM_NS,
    all_running,
    diagnostics,
    helm,
    job_pods,
    start_job,
    wait_for,
)

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(600)]

DASHBOARD = CHART / "files" / "frscope-dashboard.json"
STUCK_FUNCTION = "load_batch"

# The training script: plain torch, no frscope. Every rank does three all_reduces; then the stuck rank
# waits forever in load_batch() while the others wait in the fourth all_reduce.
TRAIN_PY = """\
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def load_batch():
    while True:
        time.sleep(1)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    rank = dist.get_rank()
    stuck = dist.get_world_size() - 1
    env = os.environ
    # One write: under torchrun the ranks of a pod share its stdout, and print() writes its arguments
    # and the newline one by one, which interleaves between the ranks.
    sys.stdout.write(f"rank {rank} of {dist.get_world_size()} up; "
                     f"TRAINER_SITECUSTOMIZE={env.get('TRAINER_SITECUSTOMIZE')}\\n")
    sys.stdout.flush()
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == stuck:
        load_batch()
    dist.all_reduce(t)
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
"""


# ---- Prometheus with the chart's PodMonitor, as the Prometheus Operator turns it into a scrape job ----
# Debian's prometheus is built without Kubernetes service discovery (`kubernetes_sd_configs` is an
# unknown field there), so the test does the discovery: every container port of every pod, read from
# the API server, with the `__meta_kubernetes_pod_*` labels Kubernetes SD (role: pod) gives it, in a
# file_sd file. The relabelling that follows is the PodMonitor's, as the Prometheus Operator writes it.
def _sanitize(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def discover_pods(node: Any, path: Path) -> int:
    targets = []
    for pod in node.plane.kubectl_json("get", "pods", "--all-namespaces")["items"]:
        ip = pod.get("status", {}).get("podIP")
        if not ip or pod["status"].get("phase") != "Running":
            continue
        meta = pod["metadata"]
        base = {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"],
                "__meta_kubernetes_pod_ip": ip}
        for key, value in (meta.get("labels") or {}).items():
            base[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = value
            base[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
        for kind, init in (("containers", "false"), ("initContainers", "true")):
            for c in pod["spec"].get(kind) or []:
                for port in c.get("ports") or []:
                    labels = {**base, "__meta_kubernetes_pod_container_name": c["name"],
                              "__meta_kubernetes_pod_container_init": init,
                              "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                              "__meta_kubernetes_pod_container_port_number": str(port["containerPort"])}
                    targets.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": labels})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(targets))
    tmp.replace(path)
    return len(targets)


def podmonitor_scrape_config(node: Any, home: Path, sd_file: Path) -> dict[str, Any]:
    args = ["template", RELEASE, str(CHART), "--namespace", SYSTEM_NS, "--set", "podMonitor.enabled=true",
            "--set", "podMonitor.interval=2s", "--set", "podMonitor.scrapeTimeout=2s"]
    for s in CHART_SETS:
        args += ["--set", s]
    rendered = [d for d in yaml.safe_load_all(helm(node, home, *args).stdout) if d]
    [pm] = [d for d in rendered if d["kind"] == "PodMonitor"]
    [endpoint] = pm["spec"]["podMetricsEndpoints"]
    [(label, value)] = pm["spec"]["selector"]["matchLabels"].items()
    relabel: list[dict[str, Any]] = [
        {"action": "keep", "source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(label)}"], "regex": value},
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
         "regex": endpoint["port"]},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{pm['metadata']['namespace']}/{pm['metadata']['name']}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    # The PodMonitor's own relabelings, field for field as the Prometheus Operator writes them.
    fields = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex",
              "replacement": "replacement", "action": "action", "separator": "separator"}
    for r in endpoint.get("relabelings", []):
        unknown = set(r) - set(fields)
        assert not unknown, f"relabeling field(s) this test does not translate: {unknown}"
        relabel.append({fields[k]: v for k, v in r.items()})
    # The sidecars' HTTPS (sidecar.tls, the default), as the Prometheus Operator writes scheme and tlsConfig.
    tls = {"scheme": endpoint["scheme"]} if "scheme" in endpoint else {}
    if (endpoint.get("tlsConfig") or {}).get("insecureSkipVerify"):
        tls["tls_config"] = {"insecure_skip_verify": True}
    return {
        **tls,
        "job_name": f"podMonitor/{pm['metadata']['namespace']}/{pm['metadata']['name']}/0",
        "metrics_path": endpoint["path"],
        "scrape_interval": endpoint["interval"],
        "scrape_timeout": endpoint["scrapeTimeout"],
        "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "1s"}],
        "relabel_configs": relabel,
    }


class Prometheus:
    def __init__(self, url: str, sd_file: Path) -> None:
        self.url = url
        self.sd_file = sd_file

    def query(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return list(body["data"]["result"])


@pytest.fixture(scope="module")
def prometheus(node: Any, installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is missing: `make deps-apt` installs Debian's prometheus package", pytrace=False)
    work = tmp_path_factory.mktemp("prometheus")
    sd_file = work / "pods.json"
    discover_pods(node, sd_file)
    config = {"global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
              "scrape_configs": [podmonitor_scrape_config(node, installed, sd_file)]}
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = node_free_port()
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    try:
        prom = Prometheus(f"http://127.0.0.1:{port}", sd_file)

        def ready() -> bool:
            assert proc.poll() is None, (work / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for("prometheus /-/ready", ready, 60, 0.5)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
        log.close()


def node_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stall_query() -> str:
    """The dashboard's per-rank stall panel (one series per rank and group, the top 20), with Grafana's
    variables set to "all"."""
    dashboard = json.loads(DASHBOARD.read_text())
    [expr] = [t["expr"] for p in dashboard["panels"] if p.get("type") != "row" for t in p.get("targets", [])
              if t["expr"].startswith("topk(") and "(frscope_collective_stalled{" in t["expr"]]
    for var in ("namespace", "job", "pg"):
        expr = expr.replace(f"${var}", ".*")
    return str(expr)


def pulled_from_registry(node: Any, status: dict[str, Any]) -> None:
    """A container's image came from the node's registry: the digest buildah pushed."""
    registry = node.registry
    assert status["image"] == registry.image, status
    assert status["imageID"] == f"{registry.image_repository}@{registry.image_digest}", status


# ---- the journey --------------------------------------------------------------------------------
def test_helm_test_checks_the_installed_release(node: Any, installed: Path) -> None:
    """The chart from the registry is installed (the `installed` fixture) and its `helm test` hook passes:
    the operator answers /healthz and /readyz through its Service, and its webhook serves TLS that the
    chart's CA verifies and answers a dry-run review of an opted-in pod with the sidecar."""
    [operator] = node.plane.kubectl_json("-n", SYSTEM_NS, "get", "pods", "-l",
                                         "app.kubernetes.io/component=operator")["items"]
    pulled_from_registry(node, operator["status"]["containerStatuses"][0])
    assert operator["spec"]["containers"][0]["imagePullPolicy"] == "Always"
    out = helm(node, installed, "test", RELEASE, "--namespace", SYSTEM_NS, "--logs", "--timeout", "3m",
               timeout=240).stdout
    assert re.search(r"^Phase:\s+Succeeded$", out, re.MULTILINE), out
    for needle in (":80/healthz: 200", ":80/readyz: 200", ":443/inject: TLS verified (the chart CA)",
                   "the sidecar patch for an opted-in pod", "PASS"):
        assert needle in out, f"{needle!r} not in:\n{out}"
    [test_pod] = node.plane.kubectl_json("-n", SYSTEM_NS, "get", "pods", "-l", "app.kubernetes.io/component=test")[
        "items"]
    pulled_from_registry(node, test_pod["status"]["containerStatuses"][0])


@pytest.mark.parametrize("launcher", ["torchrun", "python"])
def test_the_journey(node: Any, installed: Path, prometheus: Prometheus, launcher: str) -> None:
    ns = f"journey-{launcher}"
    try:
        journey(node, prometheus, launcher, ns)
    finally:  # a stuck job left running would eat the CPU of every test after it
        node.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def journey(node: Any, prometheus: Prometheus, launcher: str, ns: str) -> None:
    name = "train"
    nproc = int(LAUNCHERS[launcher]["nproc"])
    world = 2 * nproc
    stuck = world - 1
    # Step 1 (the fixture): the operator is Ready behind its Service.
    deploy = node.plane.kubectl_json("-n", SYSTEM_NS, "get", "deployment", RELEASE)
    assert deploy["status"].get("readyReplicas") == 1
    job = start_job(node, ns, name, launcher, TRAIN_PY)
    uid = job["metadata"]["uid"]
    dump = diagnostics(node, ns, name)

    # Step 2-3: the training operator's pods, injected by the webhook, run.
    wait_for("both pods Running", lambda: all_running(node, ns, name), 180, diagnostics=dump)
    for pod in job_pods(node, ns, name):
        spec = pod["spec"]
        sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
        assert [c["name"] for c in sidecars] == ["frscope-sidecar"], spec
        assert pod["metadata"]["annotations"].get("frscope.io/injected"), pod["metadata"]
        [sidecar_status] = [c for c in pod["status"]["initContainerStatuses"] if c["name"] == "frscope-sidecar"]
        pulled_from_registry(node, sidecar_status)
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["PET_NPROC_PER_NODE"] == str(nproc) and env["WORLD_SIZE"] == str(world), env

    # The hang starts once every rank is up (torchrun's agent and each rank import torch first: that
    # alone takes tens of seconds on a busy machine).
    def ranks_up() -> bool:
        return sum(node.kubectl("-n", ns, "logs", p["metadata"]["name"], "-c", "pytorch", check=False)
                   .stdout.count(" up; ") for p in job_pods(node, ns, name)) == world

    wait_for("every rank up", ranks_up, 240, 2, diagnostics=dump)
    started = time.monotonic()

    # Step 4: within 90 s of the hang, the diagnosis is on the job.
    def condition() -> dict[str, Any] | None:  # confirmed: a suspected stall (status Unknown) comes first
        got = node.plane.kubectl_json("-n", ns, "get", "pytorchjob", name)
        ours = next((c for c in got.get("status", {}).get("conditions", []) if c["type"] == CONDITION), None)
        return ours if ours is not None and ours["status"] == "True" else None

    ours = wait_for("frscope's confirmed condition on the job", condition, 90, 2, diagnostics=dump)
    took = time.monotonic() - started
    described = node.kubectl("-n", ns, "describe", "pytorchjob", name).stdout
    events = " ".join(described.split("Events:")[1].split())
    assert ours["reason"] in events and "Warning" in events, described
    for needle in (f"Rank {stuck}", "all_reduce", "group 0", STUCK_FUNCTION):
        assert needle in events, f"{needle!r} not in the Events of:\n{described}"
    assert f"Rank {stuck}" in ours["message"] and "all_reduce" in ours["message"], ours
    # The training operator's own conditions are intact and STATE is still its Running.
    got = node.plane.kubectl_json("-n", ns, "get", "pytorchjob", name)
    types = [c["type"] for c in got["status"]["conditions"]]
    assert "Created" in types and "Running" in types and types[-1] == "Running", types
    table = node.kubectl("-n", ns, "get", "pytorchjob", name).stdout
    assert table.splitlines()[1].split()[1] == "Running", table
    # The report is owned by the job and names the function the stuck rank is in.
    reports = [r for r in node.plane.kubectl_json("-n", ns, "get", "flightrecorderreports")["items"]
               if not r["job"].get("suspicion")]  # a suspicion's report may come first
    assert len(reports) == 1, reports
    assert reports[0]["metadata"]["ownerReferences"][0]["uid"] == uid
    report_text = node.kubectl("-n", ns, "describe", "flightrecorderreport", reports[0]["metadata"]["name"]).stdout
    assert STUCK_FUNCTION in report_text, report_text
    print(f"journey: diagnosed {took:.0f}s after every rank was up")
    # In every rank the image's own sitecustomize ran, which the bootstrap shadows (that the bootstrap
    # served every rank is checked below: each rank's worker server answered its pod's sidecar).
    for pod in job_pods(node, ns, name):
        logs = node.kubectl("-n", ns, "logs", pod["metadata"]["name"], "-c", "pytorch").stdout
        ups = [line for line in logs.splitlines() if " up; " in line]
        assert len(ups) == nproc, logs
        for line in ups:
            assert "TRAINER_SITECUSTOMIZE=ran" in line, line

    # Step 5: Prometheus scraped every sidecar at its pod IP; the stall panel shows the waiting ranks.
    discover_pods(node, prometheus.sd_file)

    def stalled() -> set[str]:
        return {r["metric"]["rank"] for r in prometheus.query(stall_query())
                if r["value"][1] == "1" and r["metric"]["namespace"] == ns}

    # The bootstrap served every rank, whichever launcher started it: each rank's worker server
    # answered its sidecar (under torchrun the agent process must serve none, the workers all).
    served_query = f'frscope_worker_up{{namespace="{ns}"}} == 1'
    wait_for("every rank's worker server answering its sidecar",
             lambda: {r["metric"]["rank"] for r in prometheus.query(served_query)} == {str(r) for r in range(world)},
             60, 2, diagnostics=dump)
    waiters = {str(r) for r in range(world) if r != stuck}
    wait_for("the stall panel to show the waiting ranks", lambda: stalled() >= waiters, 90, 2, diagnostics=dump)
    assert str(stuck) not in stalled()  # the stuck rank has no collective in flight: it is not "stalled"
    up_query = f'up{{job="frscope-system/frscope-sidecars", namespace="{ns}"}} == 1'
    up = wait_for("both sidecars scraped", lambda: len(prometheus.query(up_query)) == 2 and prometheus.query(up_query),
                  30, 1, diagnostics=dump)
    pod_ips = {p["status"]["podIP"] for p in job_pods(node, ns, name)}
    assert {r["metric"]["instance"].split(":")[0] for r in up} == pod_ips
    assert {(r["metric"]["training_job"], r["metric"]["job_kind"]) for r in up} == {(name, "pytorchjob")}
    assert {r["metric"]["pytorchjob"] for r in up} == {name}  # the label queries before TrainJobs used

    # Step 6: deleting the job removes its pods and the report.
    node.kubectl("-n", ns, "delete", "pytorchjob", name, "--wait=true", "--timeout=60s")
    wait_for("the pods and the report to go", lambda: not job_pods(node, ns, name) and not node.plane.kubectl_json(
        "-n", ns, "get", "flightrecorderreports")["items"], 120, diagnostics=dump)
