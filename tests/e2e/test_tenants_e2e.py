"""Tenants cannot borrow the operator's credential (issue 26), on the real API server (testenv):

- the operator mints, with the TokenRequest API and exactly the chart's Role, a token per pod whose
  audience names the pod; a real sidecar accepts its own pod's token and refuses another pod's, the
  shared audience's and a token nested 1,500 deep (401, not 500); the operator's client shows each
  pod its own token and mints once per pod while the token is fresh.

A tenant cannot fence a shared node (issue 34), on the real API server with the real CRDs, the chart's
RBAC and `frscope operator` as its own process: one hostile tenant alone (two jobs, Xid text in its
containers' termination messages, a report it wrote itself) leaves the node watched; the node's own
condition (set through the Node's status subresource, as node-problem-detector does) plus incidents of
two namespaces suspects it. The incidents are simulated as tests/e2e/test_node_ledger_e2e.py explains.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.e2e.sa_tokens import request_token
from tests.e2e.test_actions_e2e import new_namespace
from tests.e2e.test_auth_e2e import http
from tests.e2e.test_node_ledger_e2e import (  # noqa: F401  (setup: a fixture used by name)
    XID_CONDITION,
    frnode,
    node_events,
    ready_nodes,
    set_condition,
    setup,
    simulated_report,
    watching,
)
from tests.e2e.test_operator_e2e import ROOT, namespace, operator, wait_for  # noqa: F401  (fixtures used by name)

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e]


def chart_token_role(kube: ControlPlane, account: str, home: Path) -> list[dict[str, Any]]:
    """The chart's rules for minting the operator's own tokens, for `account` (rendered by the real helm)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    proc = subprocess.run([str(kube.bin_dir / "helm"), "template", "frs", str(ROOT / "charts" / "frscope"),
                           "--namespace", "frscope-system"], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    [role] = [o for o in yaml.safe_load_all(proc.stdout)
              if o and o["kind"] == "Role" and o["metadata"]["name"].endswith("-operator-tokens")]
    rules = role["rules"]
    assert [(r["resources"], r["verbs"]) for r in rules] == [(["serviceaccounts/token"], ["create"])]
    return [{**r, "resourceNames": [account]} for r in rules]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.mark.timeout(180)
async def test_a_token_minted_for_one_pod_opens_only_that_pods_sidecar(kube: ControlPlane, namespace: str,
                                                                       tmp_path: Path) -> None:
    import aiohttp

    from frscope.operator.evidence.sidecars import SidecarClient, SidecarError
    from frscope.operator.kube import KubeClient, StaticToken
    from frscope.operator.kube.pod_tokens import PodTokens
    from frscope.wire import sidecar_audience

    for account in ("operator", "trainer"):
        kube.kubectl("create", "serviceaccount", account, "-n", namespace)
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "operator-tokens", "namespace": namespace},
                "rules": chart_token_role(kube, "operator", tmp_path / "helm-home")})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "operator-tokens", "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "operator-tokens"},
                "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": namespace}]})
    identity = f"system:serviceaccount:{namespace}:operator"
    tokens_dir = tmp_path / "tokens"
    tokens_dir.mkdir()
    (tokens_dir / "api-token").write_text(request_token(kube, namespace, "trainer"))
    (tokens_dir / "ca.crt").write_bytes(kube.ca_file.read_bytes())
    port_file = tmp_path / "port"
    log = open(tmp_path / "sidecar.log", "wb")  # closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(tmp_path), "--evidence-dir", "none",
         "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), "--pod", "train-worker-0",
         "--namespace", namespace, "--operator-identity", identity,
         "--kube-token-dir", str(tokens_dir), "--api-server", kube.server],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
    ssl_context = ssl.create_default_context(cafile=str(kube.ca_file))
    operator_api_token = request_token(kube, namespace, "operator")
    try:
        port = int(wait_for("the sidecar's port", lambda: port_file.exists() and port_file.read_text().strip(), 60))
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context)) as api, \
                aiohttp.ClientSession() as session:
            minter = PodTokens(KubeClient(api, kube.server, auth=StaticToken(operator_api_token)), identity)
            client = SidecarClient(session, tokens=minter)
            got = await client.status(base, 10, pod=(namespace, "train-worker-0"))
            assert got.pod == "train-worker-0"
            await client.status(base, 10, pod=(namespace, "train-worker-0"))
            assert minter.minted == 1  # cached while fresh
            # The token minted for another pod (what a pod posing as a sidecar would capture): refused.
            with pytest.raises(SidecarError, match="HTTP 401"):
                await client.status(base, 10, pod=(namespace, "train-worker-1"))
            with pytest.raises(SidecarError, match="HTTP 401"):
                await client.status(base, 10)  # no pod named: no credential at all
            own = await minter.token(namespace, "train-worker-0")
        claims = json.loads(base64.urlsafe_b64decode(own.split(".")[1] + "=="))
        assert claims["aud"] == [sidecar_audience(namespace, "train-worker-0")] and claims["sub"] == identity

        def status(token: str) -> int:
            return http("GET", base + "/v1/status", token=token)[0]

        header, rest = own.split(".", 1)
        deep = b64(json.dumps({"alg": "RS256", "x": [[[]]]}).replace("[[[]]]", "[" * 1500 + "]" * 1500).encode())
        refused = {
            "the shared audience": status(request_token(kube, namespace, "operator", audience="frscope.io/sidecar")),
            "another pod's audience": status(request_token(kube, namespace, "operator",
                                                           audience=sidecar_audience(namespace, "train-worker-1"))),
            "a header nested 1,500 deep": status(f"{deep}.{rest}"),
        }
        assert refused == dict.fromkeys(refused, 401)
        assert status(own) == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.mark.timeout(120)
async def test_a_storm_of_bad_push_tokens_costs_a_bounded_number_of_reviews(kube: ControlPlane) -> None:
    """50 refused tokens from one client at the operator's real push endpoint, reviewed by the real API
    server: 10 TokenReviews, then 429 with Retry-After and no review."""
    import aiohttp
    from prometheus_client import CollectorRegistry

    from frscope.operator.kube import KubeClient, StaticToken
    from frscope.operator.model.operator_metrics import OperatorMetrics
    from frscope.operator.serve.access import FAILURES_BURST, KubernetesPush, Reviewer
    from frscope.operator.serve.operator_http import Health, OperatorHttp

    ssl_context = ssl.create_default_context(cafile=str(kube.ca_file))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context)) as api, \
            aiohttp.ClientSession() as session:
        reviewer = Reviewer(KubeClient(api, kube.server, auth=StaticToken(kube.admin_token)))
        registry = CollectorRegistry()
        http_server = OperatorHttp(registry=registry, metrics=OperatorMetrics(registry), health=Health(),
                                   on_push=lambda evidence: None, push_auth=KubernetesPush(reviewer))
        port = await http_server.start("127.0.0.1", 0)
        try:
            codes = []
            for i in range(50):
                async with session.post(f"http://127.0.0.1:{port}/v1/push", data=b"{}",
                                        headers={"Authorization": f"Bearer not-a-token-{i}"}) as resp:
                    codes.append(resp.status)
            assert codes == [401] * FAILURES_BURST + [429] * (50 - FAILURES_BURST)
            assert reviewer.reviews == FAILURES_BURST
        finally:
            await http_server.stop()


# -- the node ledger: no tenant fences a shared node ---------------------------------------------------
XID_TEXT = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."


@pytest.mark.timeout(300)
def test_a_hostile_tenant_alone_never_suspects_a_shared_node_the_nodes_condition_and_two_tenants_do(
        kube: ControlPlane, setup: dict[str, Any], tmp_path: Path) -> None:
    suffix = secrets.token_hex(3)
    shared, spare = f"shared-{suffix}", f"spare-{suffix}"
    with ready_nodes(kube, [shared, spare], f"pool-{suffix}"):
        evil, good = new_namespace(kube), new_namespace(kube)
        # The hostile tenant: two jobs pinned on the shared node; one hangs (its own NetworkPolicy can do
        # that), one crashes with the Xid text its container wrote; and a report it made itself.
        simulated_report(kube, evil, "j1", "NotCompleted", {shared: [1]}, age_s=1200)
        simulated_report(kube, evil, "j2", "RankStopped", {shared: [1]}, age_s=900,
                         exits={"1": {"exit_code": 1, "reason": "Error", "message": XID_TEXT}})
        simulated_report(kube, evil, "j3", "NotCompleted", {shared: [0]}, age_s=600, sealed=False)
        args = [*setup["args"], *watching([evil, good]), "--cordon-max-nodes", "5"]
        with operator(kube, setup["kubeconfig"], tmp_path / "operator.log", args) as op:
            wait_for("the hostile tenant's incidents", lambda: len(frnode(kube, shared).get("incidents", [])) == 2,
                     90, interval=1, diagnostics=op.logs)
            wait_for("the forged report ignored", lambda: "frscope_node_reports_unsealed_total 1.0" in op.metrics(),
                     30, interval=1, diagnostics=op.logs)
            time.sleep(3)  # refreshes ran
            alone = frnode(kube, shared)
            assert alone["summary"]["state"] == "watched", alone
            assert (alone["summary"]["distinctJobs"], alone["summary"]["distinctNamespaces"]) == (1, 1), alone
            assert sorted(i["evidence"] for i in alone["incidents"]) == ["code", "stuck-collective"], alone
            assert "fence" not in alone and not [e for e in node_events(kube, shared) if e["type"] == "Warning"]

            # The node now reports a problem itself (a GPU health agent's condition): still one tenant's word.
            set_condition(kube, shared, XID_CONDITION)
            simulated_report(kube, evil, "j4", "RankStopped", {shared: [2]}, age_s=300,
                             exits={"2": {"exit_code": 1, "message": XID_TEXT}})
            wait_for("the node's own evidence", lambda: len(frnode(kube, shared).get("incidents", [])) == 3, 60,
                     interval=1, diagnostics=op.logs)
            still = frnode(kube, shared)
            assert still["summary"]["state"] == "watched" and still["summary"]["nodeSourced"] == 1, still

            # A second tenant's job fails on the node too: two namespaces and the node's word.
            simulated_report(kube, good, "train", "RankStopped", {shared: [0]}, age_s=120,
                             exits={"0": {"exit_code": 1, "message": "RuntimeError: NCCL error"}})
            wait_for("the node suspected", lambda: frnode(kube, shared).get("summary", {}).get("state") == "suspected",
                     60, interval=1, diagnostics=op.logs)
            wait_for("the dry run", lambda: frnode(kube, shared).get("fence", {}).get("state") == "would-fence", 30,
                     interval=1, diagnostics=op.logs)
        suspected = frnode(kube, shared)
        assert suspected["summary"]["distinctNamespaces"] == 2 and suspected["summary"]["nodeSourced"] == 2
        by_ns = {i["key"].split("/")[0]: i for i in suspected["incidents"] if i["evidence"] == "hardware-exit"}
        assert set(by_ns) == {evil, good} and "GpuXidError=True" in by_ns[good]["why"], suspected
        [warning] = [e for e in node_events(kube, shared) if e["reason"] == "NodeSuspected"]
        assert "evidence from 2 namespaces" in warning["message"]
        assert not kube.kubectl_json("get", "node", shared)["spec"].get("unschedulable")  # the default: a dry run


def node_problem_detector() -> Path | None:
    """The node-problem-detector binary testenv/build-npd made (k8s.io/node-problem-detector v1.34.0)."""
    proc = subprocess.run([str(ROOT / "testenv" / "build-npd"), "--check"], capture_output=True, text=True,
                          check=False, timeout=60)
    return Path(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 and proc.stdout.strip() else None


@pytest.mark.timeout(300)
def test_a_real_node_problem_detector_sets_the_condition_the_ledger_reads(
        kube: ControlPlane, setup: dict[str, Any], tmp_path: Path) -> None:
    """The real node-problem-detector (testenv/build-npd: k8s.io/node-problem-detector v1.34.0) runs for the
    shared node against the API server, with a custom plugin monitor whose check reports an Xid (exit 1,
    as an NVIDIA health check does): it sets GpuXidError=True on the Node through the API server. Then
    incidents of two namespaces on that node make it suspected, with the detector's condition as the
    hardware evidence. This tier has no kubelet: the detector runs as a process for that Node's name."""
    binary = node_problem_detector()
    if binary is None:
        pytest.skip("node-problem-detector is not built: testenv/build-npd")
    suffix = secrets.token_hex(3)
    shared, spare = f"npd-{suffix}", f"spare-{suffix}"
    check = tmp_path / "check-gpu.sh"
    check.write_text("#!/bin/sh\necho 'NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus'\nexit 1\n")
    check.chmod(0o755)
    monitor = tmp_path / "gpu-health.json"
    monitor.write_text(json.dumps({
        "plugin": "custom", "source": "gpu-health-e2e", "metricsReporting": False,
        "pluginConfig": {"invoke_interval": "2s", "timeout": "5s", "max_output_length": 200, "concurrency": 1},
        "conditions": [{"type": "GpuXidError", "reason": "NoXid", "message": "no Xid seen"}],
        "rules": [{"type": "permanent", "condition": "GpuXidError", "reason": "Xid79", "path": str(check),
                   "timeout": "5s"}],
    }))
    with ready_nodes(kube, [shared, spare], f"pool-{suffix}"):
        log = open(tmp_path / "npd.log", "wb")  # closed below
        npd = subprocess.Popen(
            [str(binary), f"--apiserver-override={kube.server}?inClusterConfig=false&auth={kube.kubeconfig}",
             f"--hostname-override={shared}", f"--config.custom-plugin-monitor={monitor}", "--port=0",
             "--prometheus-port=0", "--k8s-exporter-heartbeat-period=5s", "--v=2"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            def condition() -> dict[str, Any]:
                node = kube.kubectl_json("get", "node", shared)
                return next((c for c in node["status"].get("conditions", []) if c["type"] == "GpuXidError"), {})

            wait_for("node-problem-detector's condition", lambda: condition().get("status") == "True", 120,
                     interval=1, diagnostics=lambda: (tmp_path / "npd.log").read_text(errors="replace")[-3000:])
            assert condition()["reason"] == "Xid79" and "fallen off the bus" in condition()["message"]
            one, two = new_namespace(kube), new_namespace(kube)
            simulated_report(kube, one, "train", "RankStopped", {shared: [0]}, age_s=300,
                             exits={"0": {"exit_code": 1, "message": "RuntimeError: NCCL error"}})
            simulated_report(kube, two, "train", "NotCompleted", {shared: [1]}, age_s=200)
            with operator(kube, setup["kubeconfig"], tmp_path / "operator.log",
                          [*setup["args"], *watching([one, two])]) as op:
                wait_for("the node suspected", lambda: frnode(kube, shared).get("summary", {}).get("state")
                         == "suspected", 90, interval=1, diagnostics=op.logs)
        finally:
            npd.terminate()
            try:
                npd.wait(timeout=15)
            except subprocess.TimeoutExpired:
                npd.kill()
                npd.wait()
            log.close()
        suspected = frnode(kube, shared)  # (the node and its ledger object go when the nodes do)
        summary = suspected["summary"]
        assert summary["nodeSourced"] == 2 and summary["distinctNamespaces"] == 2, suspected
        assert all("the node's condition GpuXidError=True (Xid79" in i["why"] for i in suspected["incidents"]), \
            suspected
