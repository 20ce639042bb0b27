"""Every PromQL expression of the Grafana dashboard and of the alert rules, evaluated by a real Prometheus
(Debian's package) that scrapes a real `frscope sidecar` beside a real hung torch job (gloo, loopback,
frscope/demo's `hang` fault: rank 1 never joins the 4th all_reduce, rank 0 waits in it).

The alert rules are the ones helm renders into the PrometheusRule (same expressions; `for:` shortened).
Prometheus gets what Kubernetes service discovery would give a sidecar's target (`namespace`, `pod`,
the pod's labels as `__meta_kubernetes_pod_label_*`, job `<release namespace>/<release>-frscope-sidecars`)
from a static scrape config, with the PodMonitor's own relabelings (as helm renders them) as its
relabel_configs: the live sidecar's pod carries the labels JobSet puts on a TrainJob's pods, the
second target (nobody serves it: a sidecar that is down) a PyTorchJob pod's labels.

The operator's metrics (diagnoses) come from a real `frscope operator` that diagnoses that same hang:
the chart installed by helm into the API server from testenv, the operator run with a token of the
chart's ServiceAccount (test_operator_queries_return_data).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from frscope.demo.launcher import LocalJob, start_job

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.chart_tools import CHART, Helm, objects, rules_file
except ModuleNotFoundError:
    from chart_tools import CHART, Helm, objects, rules_file

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(300)]

RELEASE, RELEASE_NAMESPACE = "frs", "frscope-system"
SIDECAR_JOB = f"{RELEASE_NAMESPACE}/{RELEASE}-frscope-sidecars"  # what the PodMonitor's targets get
OPERATOR_JOB = f"{RELEASE}-frscope"  # what the ServiceMonitor's target gets (the Service's name)
# The job's namespace: a real one in the API server for the operator's part.
ML = f"ml-{secrets.token_hex(3)}"
JOB = "demo"
NODE = f"gpu-{secrets.token_hex(3)}"
POD_LABEL = "__meta_kubernetes_pod_label_"
# A TrainJob's pod (created by the JobSet controller: JobSet's labels only) ...
TARGET_LABELS = {"namespace": ML, "pod": "demo-node-0-0-x7k2p", f"{POD_LABEL}jobset_sigs_k8s_io_jobset_name": JOB,
                 f"{POD_LABEL}jobset_sigs_k8s_io_replicatedjob_name": "node"}
# ... and a PyTorchJob's (the training operator's labels).
LEGACY_JOB = "legacy"
DOWN_LABELS = {"namespace": ML, "pod": "legacy-worker-0", f"{POD_LABEL}training_kubeflow_org_job_name": LEGACY_JOB,
               f"{POD_LABEL}training_kubeflow_org_replica_type": "worker"}
SCRAPE_S = 1
# Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval): 4 s at the
# least here; 10 s (a short dashboard range) keeps a scrape missed on a busy machine from emptying it.
RATE_INTERVAL = "10s"
# A query is retried for this long before it counts as returning no data (scrapes can lag on 2 cores).
DATA_WAIT_S = 20
DASHBOARD = CHART / "files" / "frscope-dashboard.json"
# Only NCCL with timing records durations; a gloo job leaves the histogram without series.
NEEDS_DURATIONS = "frscope_collective_duration_seconds_bucket"
# Only after a rank's worker server stopped answering (phase two below).
NEEDS_POLL_ERRORS = "frscope_poll_errors_total"
# Only with a real operator scraped as well (test_operator_queries_return_data).
NEEDS_OPERATOR = ("frscope_operator_", "frscope_node_")  # the operator's metrics and its node ledger's


def _needs_operator(expr: str) -> bool:
    return any(prefix in expr for prefix in NEEDS_OPERATOR)


# Empty on this stack's job by design: a hung job has no straggler to name (no rank came last often enough),
# so no rank series; the real straggler's ranks are checked in tests/unit/operator/test_live_windows.py.
EMPTY_ON_A_HANG = ("frscope_operator_job_perf_rank_cost_seconds",)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait(what: str, probe: Any, timeout: float, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass
class Prometheus:
    url: str
    started: float
    log: Path

    def get(self, path: str, **params: str | list[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
            e.close()
            raise AssertionError(f"prometheus {path} {params}: HTTP {e.code} {body}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        result = data["result"]
        return result if data["resultType"] == "vector" else [{"metric": {}, "value": result}]

    def query_data(self, expr: str, timeout: float = DATA_WAIT_S) -> list[dict[str, Any]]:
        """The query's result once it has data, or [] after `timeout` (a PromQL error raises at once)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(1)

    def label_values(self, label: str, match: str) -> list[str]:
        values: list[str] = self.get(f"/api/v1/label/{label}/values", **{"match[]": [match]})
        return values


@dataclass
class Stack:
    prometheus: Prometheus
    job: LocalJob
    sidecar_port: int
    rules: list[dict[str, Any]]
    # Prometheus scrapes the operator (job OPERATOR_JOB) from the targets written here (file_sd).
    operator_targets: Path
    phase: list[str] = field(default_factory=lambda: ["hung"])
    # The CA of the sidecar's certificate when it serves HTTPS (the chart's default), as the operator holds it.
    ca_dir: Path | None = None

    @property
    def sidecar_url(self) -> str:
        return f"{'https' if self.ca_dir else 'http'}://127.0.0.1:{self.sidecar_port}"

    def sidecar_context(self) -> ssl.SSLContext | None:
        """As Prometheus scrapes it: encrypted, the certificate (it names the pod, not 127.0.0.1) not checked."""
        if self.ca_dir is None:
            return None
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context


def _grafana(expr: str, variables: dict[str, str], range_s: float) -> str:
    """What Grafana sends for a panel query: its variables and macros substituted."""
    out = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", f"{max(int(range_s), 5)}s")
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        out = out.replace(f"${name}", value)
    assert "$" not in out, out
    return out


def _dashboard_targets() -> list[tuple[str, str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["refId"], target["expr"])
        for panel in dashboard["panels"]
        if panel["type"] not in ("row", "text")
        for target in panel["targets"]
    ]


def _variables() -> dict[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {v["name"]: v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"}


@pytest.fixture(scope="module")
def rendered(testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    helm = Helm(testenv_bin_dir / "helm", tmp_path_factory.mktemp("helm-home"))
    return objects(helm, "install", release=RELEASE, namespace=RELEASE_NAMESPACE,
                   sets=["prometheusRule.stalledFor=2s", "prometheusRule.sidecarDownFor=2s",
                         "prometheusRule.operatorDownFor=2s", "podMonitor.enabled=true"])


@pytest.fixture(scope="module")
def rules(rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(rules_file(rendered))["groups"]
    return [rule for group in groups for rule in group["rules"]]


_RELABEL_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex",
                 "replacement": "replacement", "action": "action", "separator": "separator"}


@pytest.fixture(scope="module")
def relabel_configs(rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The PodMonitor's relabelings as Prometheus' relabel_configs (what the Prometheus operator does)."""
    [monitor] = [o for o in rendered if o["kind"] == "PodMonitor"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    return [{_RELABEL_KEYS[k]: v for k, v in r.items()} for r in endpoint["relabelings"]]


@pytest.fixture(scope="module")
def scrape_tls(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    """The PodMonitor's scheme and tlsConfig as Prometheus' (the sidecars serve HTTPS: sidecar.tls)."""
    [monitor] = [o for o in rendered if o["kind"] == "PodMonitor"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    tls: dict[str, Any] = {"scheme": endpoint["scheme"]} if "scheme" in endpoint else {}
    if (endpoint.get("tlsConfig") or {}).get("insecureSkipVerify"):
        tls["tls_config"] = {"insecure_skip_verify": True}
    return tls


@pytest.fixture(scope="module")
def stack(rules: list[dict[str, Any]], relabel_configs: list[dict[str, Any]], scrape_tls: dict[str, Any],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is missing: `make deps-apt` installs Debian's prometheus package", pytrace=False)
    work = tmp_path_factory.mktemp("prometheus")
    rules_path = work / "rules.yaml"
    rules_path.write_text(yaml.safe_dump({"groups": [{"name": "frscope", "rules": rules}]}, sort_keys=False))
    with start_job("hang", 2, lifetime_s=280) as job:
        job.wait_for_sockets(time.monotonic() + 90)
        port_file = work / "sidecar.port"
        sidecar_log = (work / "sidecar.log").open("wb")
        tls_args: list[str] = []
        if scrape_tls.get("scheme") == "https":  # as the webhook injects it: a certificate of the operator's CA
            from frscope.operator.evidence.sidecar_tls import SidecarCa
            from frscope.testing.tls import key_and_csr, write_ca

            key, csr = key_and_csr()
            (work / "tls.key").write_bytes(key)
            (work / "tls.crt").write_bytes(SidecarCa(write_ca(work / "ca")).issue(
                csr, TARGET_LABELS["namespace"], TARGET_LABELS["pod"]))
            tls_args = ["--tls-cert-file", str(work / "tls.crt"), "--tls-key-file", str(work / "tls.key")]
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(job.work_dir), "--port", "0",
             "--host", "127.0.0.1", "--port-file", str(port_file), "--poll-interval", "1", "--stall-after", "3",
             "--evidence-dir", "none", "--pod", TARGET_LABELS["pod"], "--namespace", TARGET_LABELS["namespace"],
             # Every panel's series: the per-rank progress panels need the per-group detail (the alert with
             # the default, one series per pod, is in tests/e2e/promtool/frscope_rules_test.yaml).
             "--metrics-detail", "rank-group", *tls_args],
            stdout=sidecar_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        prometheus: subprocess.Popen[bytes] | None = None
        prom_log = (work / "prometheus.log").open("wb")
        try:
            sidecar_port = int(_wait("the sidecar's port file", lambda: port_file.is_file() and port_file.read_text(),
                                     30).strip())
            prom_port = _free_port()
            operator_targets = work / "operator-targets.json"
            operator_targets.write_text("[]")
            config = {
                "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s",
                           "scrape_timeout": f"{SCRAPE_S}s"},
                "rule_files": [str(rules_path)],
                "scrape_configs": [{
                    **scrape_tls,
                    "job_name": SIDECAR_JOB,
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{sidecar_port}"], "labels": TARGET_LABELS},
                        {"targets": [f"127.0.0.1:{_free_port()}"], "labels": DOWN_LABELS},
                    ],
                    "relabel_configs": relabel_configs,
                }, {
                    "job_name": OPERATOR_JOB,
                    # As the chart's ServiceMonitor (honorLabels): the job's namespace on
                    # frscope_operator_job_diagnosis wins over the operator target's.
                    "honor_labels": True,
                    "file_sd_configs": [{"files": [str(operator_targets)], "refresh_interval": "1s"}],
                }],
            }
            (work / "prometheus.yml").write_text(yaml.safe_dump(config))
            prometheus = subprocess.Popen(
                [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                stdout=prom_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
            prom = Prometheus(f"http://127.0.0.1:{prom_port}", time.monotonic(), work / "prometheus.log")

            def ready() -> bool:
                assert prometheus is not None and prometheus.poll() is None, (work / "prometheus.log").read_text()
                try:
                    with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as response:
                        return bool(response.status == 200)
                except OSError:
                    return False

            _wait("prometheus /-/ready", ready, 60)
            # The hang: rank 0 waits in the 4th all_reduce of the default group, and Prometheus saw it.
            _wait("frscope_collective_stalled == 1 in Prometheus",
                  lambda: prom.query('frscope_collective_stalled{rank="0", pg="0"} == 1'), 90)
            _wait("the alerts to fire", lambda: {
                a["labels"]["alertname"] for a in prom.get("/api/v1/alerts")["alerts"] if a["state"] == "firing"
            } >= {"FrscopeCollectiveStalled", "FrscopeSidecarDown"}, 60)
            time.sleep(3 * SCRAPE_S)  # a few more samples for the rate windows
            yield Stack(prom, job, sidecar_port, rules, operator_targets, ca_dir=work / "ca" if tls_args else None)
        except BaseException:
            sys.stderr.write(f"--- sidecar log\n{(work / 'sidecar.log').read_text()[-4000:]}\n")
            sys.stderr.write(f"--- prometheus log\n{(work / 'prometheus.log').read_text()[-4000:]}\n")
            raise
        finally:
            if prometheus is not None:
                _stop(prometheus)
            _stop(sidecar)
            sidecar_log.close()
            prom_log.close()


def _all_vars() -> dict[str, str]:
    return {"namespace": ".*", "job": ".*", "pg": ".*", "op": ".*"}


def _selected_vars() -> dict[str, str]:
    # What Grafana sends for a single selected value of a multi-value variable with a regex matcher.
    return {"namespace": ML, "job": JOB, "pg": "0", "op": "ALLREDUCE"}


def test_variable_queries_return_the_job(stack: Stack) -> None:
    queries = _variables()
    found = {}
    for name, query in queries.items():
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert match, query
        selector, label = match.groups()
        found[name] = stack.prometheus.label_values(label, _grafana(selector, _all_vars(), 60))
    assert found["namespace"] == [ML]
    assert found["job"] == [JOB]
    assert {"0", "1"} <= set(found["pg"])  # the default group and the demo's subgroup
    assert "ALLREDUCE" in found["op"] and "BROADCAST" in found["op"]


@pytest.mark.parametrize("variables", [_all_vars(), _selected_vars()], ids=["all", "selected"])
def test_every_dashboard_query_returns_data(stack: Stack, variables: dict[str, str]) -> None:
    assert stack.phase == ["hung"], "run before test_poll_errors_after_the_ranks_die (file order)"
    with urllib.request.urlopen(f"{stack.sidecar_url}/metrics", timeout=10,
                                context=stack.sidecar_context()) as response:
        metrics_text = response.read().decode()
    empty, checked = [], 0
    for title, ref, expr in _dashboard_targets():
        if NEEDS_POLL_ERRORS in expr or (_needs_operator(expr) and "or vector(0)" not in expr):
            continue  # phase two, or the operator's test
        promql = _grafana(expr, variables, time.monotonic() - stack.prometheus.started)
        if NEEDS_DURATIONS in expr:
            result = stack.prometheus.query(promql)  # raises on a PromQL error
            checked += 1
            # Evaluated without error; gloo records no durations, so no series. The family is exposed.
            assert "# TYPE frscope_collective_duration_seconds histogram" in metrics_text
            assert result == [], result
            continue
        checked += 1
        if not stack.prometheus.query_data(promql):
            empty.append(f"{title} [{ref}]: {promql}")
    assert not empty, "queries without data:\n" + "\n".join(empty)
    assert checked >= 13


def test_panels_show_the_hang(stack: Stack) -> None:
    prom = stack.prometheus
    by = {(r["metric"]["rank"], r["metric"]["pg"]): float(r["value"][1]) for r in prom.query(_grafana(
        'max by (namespace, job_kind, training_job, rank, pg) (frscope_collective_stalled{namespace=~"$namespace", '
        'training_job=~"$job", pg=~"$pg"})', _all_vars(), 60))}
    assert by[("0", "0")] == 1.0 and by[("1", "0")] == 0.0
    completed = {r["metric"]["rank"]: float(r["value"][1]) for r in prom.query(
        'frscope_collective_last_completed_seq{pg="0"}')}
    assert completed == {"0": 3.0, "1": 3.0}  # both finished 3 all_reduces; the 4th never completes
    (age,) = prom.query('frscope_collective_inflight_age_seconds{rank="0", pg="0"}')
    assert float(age["value"][1]) >= 3.0
    (stalled,) = prom.query(_grafana(
        'count(max by (namespace, job_kind, training_job, rank) (frscope_collective_stalled{namespace=~"$namespace", '
        'training_job=~"$job", pg=~"$pg"}) == 1) or vector(0)', _all_vars(), 60))
    assert float(stalled["value"][1]) == 1.0


def test_every_alert_expression_returns_data_and_fires(stack: Stack) -> None:
    operator_up = f'job="{OPERATOR_JOB}"'  # FrscopeOperatorDown: no operator is scraped in this phase
    sidecar_rules = [r for r in stack.rules if "frscope_operator_" not in r["expr"] and operator_up not in r["expr"]]
    assert {r["alert"] for r in sidecar_rules} == {"FrscopeCollectiveStalled", "FrscopeSidecarDown"}
    for rule in sidecar_rules:
        assert stack.prometheus.query_data(rule["expr"]), f"{rule['alert']}: {rule['expr']} returned nothing"
    alerts = {a["labels"]["alertname"]: a for a in stack.prometheus.get("/api/v1/alerts")["alerts"]
              if a["state"] == "firing"}
    # No operator is scraped yet (test_operator_queries_return_data runs one): the webhook would fail open.
    assert alerts["FrscopeOperatorDown"]["labels"]["namespace"] == RELEASE_NAMESPACE
    # The sidecar exports no `_created` series (prometheus_client.disable_created_metrics in its entry point).
    assert not stack.prometheus.query('count({__name__=~"frscope_.+_created"})')
    assert stack.prometheus.query('count({__name__=~"frscope_.+_total"})')
    stalled = alerts["FrscopeCollectiveStalled"]
    labels = stalled["labels"]
    assert (labels["namespace"], labels["training_job"], labels["job_kind"], labels["pg"]) == (ML, JOB, "jobset", "0")
    assert stalled["annotations"]["summary"] == (
        f"Training job {ML}/{JOB} (jobset): collectives stalled in process group 0")
    assert f"-n {ML} {JOB} shows the diagnosis" in stalled["annotations"]["description"]
    down = alerts["FrscopeSidecarDown"]
    assert down["labels"]["pod"] == DOWN_LABELS["pod"]
    # The PodMonitor's relabelling: a PyTorchJob pod keeps `pytorchjob` and gets the kind-neutral labels.
    (legacy,) = stack.prometheus.query(f'up{{pod="{DOWN_LABELS["pod"]}"}}')
    assert {k: legacy["metric"].get(k) for k in ("training_job", "job_kind", "pytorchjob", "replica_type")} == {
        "training_job": LEGACY_JOB, "job_kind": "pytorchjob", "pytorchjob": LEGACY_JOB, "replica_type": "worker"}
    assert not [k for k in legacy["metric"] if k.startswith("__meta")]
    (live,) = stack.prometheus.query(f'up{{pod="{TARGET_LABELS["pod"]}"}}')
    assert "pytorchjob" not in live["metric"] and live["metric"]["replica_type"] == "node"
    assert down["annotations"]["summary"] == f"frscope sidecar of pod {ML}/{DOWN_LABELS['pod']} is down"
    # The rule Prometheus loaded is the one helm rendered.
    loaded = {r["name"]: r["query"] for g in stack.prometheus.get("/api/v1/rules")["groups"] for r in g["rules"]}
    assert loaded["FrscopeCollectiveStalled"] == next(
        r["expr"] for r in stack.rules if r["alert"] == "FrscopeCollectiveStalled")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _job_and_pod(kube: ControlPlane, sidecar_port: int) -> None:
    """The PyTorchJob and its pod as the training operator and a kubelet would leave them: the pod runs
    the (already injected) sidecar, whose named port is where the real sidecar listens on loopback."""
    template = {"spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]}}
    job = kube.apply({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": JOB, "namespace": ML},
        "spec": {"nprocPerNode": "2", "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}},
    })
    running = [{"type": t, "status": "True", "reason": f"PyTorchJob{t}", "message": f"PyTorchJob {JOB} is {t}.",
                "lastUpdateTime": _now(), "lastTransitionTime": _now()} for t in ("Created", "Running")]
    kube.kubectl("patch", "pytorchjob", JOB, "-n", ML, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"conditions": running}}))
    pod = TARGET_LABELS["pod"]
    # The node the pod runs on: the operator's node ledger records the hang's culprit there (a rank that
    # never joined: a code fault, score 0), which the dashboard's node panels show.
    kube.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    kube.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": pod, "namespace": ML,
            "labels": {"frscope.io/inject": "true",
                       "training.kubeflow.org/job-name": JOB, "training.kubeflow.org/replica-type": "master",
                       "training.kubeflow.org/replica-index": "0"},
            "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": JOB,
                                 "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "initContainers": [{"name": "frscope-sidecar", "image": "frscope:e2e", "restartPolicy": "Always",
                                "ports": [{"name": "frscope", "containerPort": sidecar_port}]}],
            "containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}],
            "nodeName": NODE,
        },
    })
    running_state = {"running": {"startedAt": _now()}}
    kube.kubectl("patch", "pod", pod, "-n", ML, "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
        "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "hostIP": "127.0.0.1",
        "startTime": _now(), "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _now()}],
        "initContainerStatuses": [{"name": "frscope-sidecar", "image": "frscope:e2e", "imageID": "", "ready": True,
                                   "restartCount": 0, "started": True, "state": running_state}],
        "containerStatuses": [{"name": "pytorch", "image": "registry.invalid/train:1", "imageID": "",
                               "ready": True, "restartCount": 0, "started": True, "state": running_state}],
    }}))


@pytest.mark.timeout(300)
def test_operator_queries_return_data(stack: Stack, kube: ControlPlane, tmp_path: Path) -> None:
    """The chart installed by helm into the real API server; `frscope operator` runs (here, as a process)
    with a token of the chart's ServiceAccount, diagnoses the real hang through the real sidecar, and
    Prometheus scrapes it: the operator's dashboard queries and FrscopeDiagnosisMade return data."""
    assert stack.phase == ["hung"], "run before test_poll_errors_after_the_ranks_die (file order)"
    helm = Helm(kube.bin_dir / "helm", tmp_path / "helm-home", kube.kubeconfig)
    release_ns = f"frscope-{secrets.token_hex(3)}"
    for ns in (release_ns, ML):
        kube.kubectl("create", "namespace", ns)
    log = (tmp_path / "operator.log").open("wb")
    operator: subprocess.Popen[bytes] | None = None
    try:
        helm.run("install", RELEASE, str(CHART), "--namespace", release_ns, timeout=180)
        kube.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     "crd/flightrecorderreports.frscope.io", timeout=70)
        _wait("the default ServiceAccount", lambda: kube.kubectl(
            "get", "serviceaccount", "default", "-n", ML, check=False).returncode == 0, 30)
        _job_and_pod(kube, stack.sidecar_port)
        account = f"{RELEASE}-frscope"
        token = kube.kubectl("create", "token", account, "-n", release_ns, "--duration=1h").stdout.strip()
        kubeconfig = kube.write_token_kubeconfig(tmp_path / "operator.kubeconfig", token,
                                                 f"system:serviceaccount:{release_ns}:{account}")
        port = _free_port()
        env = {**kube.env(), "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
        operator = subprocess.Popen(
            [sys.executable, "-m", "frscope", "operator", "--http-host", "127.0.0.1", "--http-port", str(port),
             "--poll-interval", "1", "--stuck-after", "1", "--cooldown", "3", "--log-level", "DEBUG",
             # The sidecar serves HTTPS with a certificate of this CA for its pod: the operator reads it so.
             *(["--sidecar-ca-dir", str(stack.ca_dir)] if stack.ca_dir else [])],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        stack.operator_targets.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"],
                                                       "labels": {"namespace": release_ns}}]))
        prom = stack.prometheus

        def diagnosed() -> bool:
            assert operator is not None and operator.poll() is None, (tmp_path / "operator.log").read_text()
            return bool(prom.query('frscope_operator_diagnoses_total{category="RankNotJoined"} > 0'))

        _wait("the operator's diagnosis in Prometheus", diagnosed, 150)
        _wait("FrscopeDiagnosisMade to fire", lambda: [
            a for a in prom.get("/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == "FrscopeDiagnosisMade" and a["state"] == "firing"], 30)
        time.sleep(3 * SCRAPE_S)
        conditions = kube.kubectl_json("get", "pytorchjob", JOB, "-n", ML)["status"]["conditions"]
        assert conditions[0]["reason"] == "RankNotJoined", conditions
        _wait("the node ledger's entry", lambda: kube.kubectl(
            "get", "flightrecordernode", NODE, check=False).returncode == 0, 30)  # the chart installed its CRD
        ledger = kube.kubectl_json("get", "flightrecordernode", NODE)
        assert (ledger["summary"]["state"], ledger["summary"]["score"]) == ("watched", 0), ledger
        assert [i["evidence"] for i in ledger["incidents"]] == ["code"], ledger

        # the job's page opened in the operator's web UI: its live window, and that window's --perf gauges
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ui/jobs/{ML}/{JOB}", timeout=30) as page:
            assert page.status == 200
        _wait("the live window's perf gauges in Prometheus",
              lambda: prom.query(f'frscope_operator_job_perf_window_seconds{{training_job="{JOB}"}}'), 60)
        empty = []
        for variables in (_all_vars(), _selected_vars()):
            for title, ref, expr in _dashboard_targets():
                if _needs_operator(expr) and not any(metric in expr for metric in EMPTY_ON_A_HANG):
                    promql = _grafana(expr, variables, time.monotonic() - prom.started)
                    if not prom.query_data(promql):
                        empty.append(f"{title} [{ref}]: {promql}")
        assert not empty, "queries without data:\n" + "\n".join(empty)
        (rule,) = [r for r in stack.rules if r["alert"] == "FrscopeDiagnosisMade"]
        (result,) = prom.query_data(rule["expr"])
        # One alert per job, with the job's namespace (routing).
        assert result["metric"] == {"namespace": ML, "training_job": JOB, "category": "RankNotJoined"}
        (alert,) = [a for a in prom.get("/api/v1/alerts")["alerts"]
                    if a["labels"]["alertname"] == "FrscopeDiagnosisMade"]
        assert alert["annotations"]["summary"] == f"frscope diagnosed training job {ML}/{JOB}: RankNotJoined"
        # The operator answers: FrscopeOperatorDown resolved; nor does the operator export `_created` series.
        _wait("FrscopeOperatorDown to resolve", lambda: not [
            a for a in prom.get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == "FrscopeOperatorDown"], 30)
        assert not prom.query('count({__name__=~"frscope_operator_.+_created"})')
    except BaseException:
        sys.stderr.write(f"--- operator log\n{(tmp_path / 'operator.log').read_text()[-6000:]}\n")
        raise
    finally:
        if operator is not None:
            _stop(operator)
        log.close()
        stack.operator_targets.write_text("[]")
        helm.run("uninstall", RELEASE, "--namespace", release_ns, "--wait", "--timeout", "60s", check=False)
        for ns in (release_ns, ML):
            kube.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def test_poll_errors_after_the_ranks_die(stack: Stack) -> None:
    """Phase two (last in this file): the trainer dies; its sockets stay behind and stop answering."""
    stack.phase[:] = ["ranks killed"]
    for rank, proc in stack.job.procs.items():
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            assert proc.poll() is not None, rank
    prom = stack.prometheus
    _wait("poll errors in Prometheus", lambda: prom.query('sum(frscope_poll_errors_total) > 0'), 60)
    _wait("frscope_worker_up == 0", lambda: prom.query("frscope_worker_up == 0"), 30)
    time.sleep(3 * SCRAPE_S)
    for variables in (_all_vars(), _selected_vars()):
        exprs = [(t, r, e) for t, r, e in _dashboard_targets() if NEEDS_POLL_ERRORS in e]
        assert exprs
        for title, ref, expr in exprs:
            promql = _grafana(expr, variables, time.monotonic() - prom.started)
            assert prom.query_data(promql), f"{title} [{ref}]: {promql} returned nothing"
