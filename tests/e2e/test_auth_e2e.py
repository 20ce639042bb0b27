"""Authentication and least privilege against the real API server (testenv):

- pushes to the operator are let in only with the pushing pod's own projected service-account token
  for the operator's audience (TokenReview); the pod and namespace come from the token;
- the web UI needs a token the API server accepts and `get pytorchjobs` in the job's namespace;
- the operator's API credentials rotate: a token file re-read per request and after a 401, per kopf
  login;
- `kubectl auth can-i` as the chart's operator account: no write on PyTorchJobs but their status.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.sa_tokens import authenticated, mint, request_token
from tests.e2e.test_operator_e2e import (  # noqa: F401  (fixtures used by name)
    JOB,
    ROOT,
    OperatorProcess,
    chart_rbac,
    namespace,
    operator_kubeconfig,
    pytorchjob,
    report_crd,
    set_job_conditions,
    training_conditions,
    wait_for,
)
from tests.unit.operator.fakes import StandInSidecar, real_snapshots

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e]

OPERATOR_AUDIENCE = "frscope.io/operator"
SIDECAR_AUDIENCE = "frscope.io/sidecar"
ACCOUNT = "system:serviceaccount:{ns}:frscope-operator"


def http(method: str, url: str, *, token: str | None = None, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
        e.close()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def training_pod(kube: ControlPlane, namespace: str, name: str, account: str) -> None:
    """A pod object of the job, running as `account` (no kubelet: the token binding only needs the object)."""
    kube.apply({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"frscope.io/inject": "true", "training.kubeflow.org/job-name": JOB,
                                        "training.kubeflow.org/replica-type": "worker"}},
                "spec": {"serviceAccountName": account,
                         "containers": [{"name": "pytorch", "image": "registry.invalid/train:1"}]}})


@pytest.fixture
def running_operator(kube: ControlPlane, namespace: str, operator_kubeconfig: Path,
                     tmp_path: Path) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(kube, operator_kubeconfig, tmp_path / "operator.log",
                           ["--poll-interval", "30", "--ui-auth", "kubernetes"])
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


# -- least privilege -------------------------------------------------------------------------------
def test_the_operator_account_may_write_only_the_jobs_status(kube: ControlPlane, report_crd: str, namespace: str,
                                                               operator_kubeconfig: Path) -> None:
    who = ACCOUNT.format(ns=namespace)

    def can(*args: str) -> bool:
        out = kube.kubectl("auth", "can-i", *args, f"--as={who}", check=False)
        return out.stdout.strip() == "yes"

    assert can("watch", "pytorchjobs.kubeflow.org", "-n", namespace)
    assert can("get", "pytorchjobs.kubeflow.org", "-n", namespace)
    assert can("patch", "pytorchjobs.kubeflow.org", "--subresource=status", "-n", namespace)
    for verb in ("patch", "update", "create", "delete"):
        assert not can(verb, "pytorchjobs.kubeflow.org", "-n", namespace), verb
    assert not can("update", "pytorchjobs.kubeflow.org", "--subresource=status", "-n", namespace)
    assert can("create", "tokenreviews.authentication.k8s.io")
    assert can("create", "subjectaccessreviews.authorization.k8s.io")
    assert can("create", "flightrecorderreports.frscope.io", "-n", namespace)
    assert not can("get", "secrets", "-n", namespace)
    assert not can("create", "serviceaccounts/token", "-n", namespace)
    assert not can("patch", "pods", "-n", namespace)


# -- pushes ----------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_pushes_need_the_pods_own_token(kube: ControlPlane, report_crd: str, namespace: str,
                                        running_operator: OperatorProcess) -> None:
    kube.apply(pytorchjob(namespace))
    kube.kubectl("create", "serviceaccount", "trainer", "-n", namespace)
    training_pod(kube, namespace, "train-worker-0", "trainer")
    training_pod(kube, namespace, "train-worker-1", "trainer")
    ranks = real_snapshots("hang")
    body = gzip.compress(json.dumps(StandInSidecar("train-worker-0", {0: ranks[0], 1: ranks[1]}).snapshot_obj()
                                    | {"reason": "stall"}).encode())
    url = running_operator.url + "/v1/push"

    def push(token: str | None, **claims: str) -> tuple[int, Any]:
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
        headers.update({f"X-Frscope-{k.capitalize()}": v for k, v in claims.items()})
        return http("POST", url, token=token, body=body, headers=headers)

    right = request_token(kube, namespace, "trainer", audience=OPERATOR_AUDIENCE, pod="train-worker-0")
    status, answer = push(right)
    assert status == 202, answer
    assert answer["pod"] == f"{namespace}/train-worker-0"  # from the token (the headers named nobody)

    # No token; the API server's own audience; no pod binding; another pod's identity; the headers of
    # kube-system: all refused.
    assert push(None)[0] == 401
    api_audience = request_token(kube, namespace, "trainer", pod="train-worker-0")
    assert authenticated(kube, api_audience) == 200  # a good token, for another audience
    status, answer = push(api_audience)
    assert status == 401 and OPERATOR_AUDIENCE in answer["error"], answer
    unbound = request_token(kube, namespace, "trainer", audience=OPERATOR_AUDIENCE)
    status, answer = push(unbound)
    assert status == 403 and "not a pod's service account" in answer["error"], answer
    status, answer = push(right, pod="train-worker-1", namespace=namespace)
    assert status == 403 and "may push only its own" in answer["error"], answer
    assert push(right, pod="kube-apiserver", namespace="kube-system")[0] == 403
    assert push(right, pod="train-worker-0", namespace=namespace)[0] == 202  # naming itself is fine

    # A token that expired (the API server allows a minute of clock skew: this one expired 9 minutes
    # ago); the same token with a live expiry is accepted, so the refusal is the expiry.
    live = mint(kube, namespace, "trainer", lifetime_s=600, audience=OPERATOR_AUDIENCE, pod="train-worker-1")
    status, answer = push(live)
    assert status == 202 and answer["pod"] == f"{namespace}/train-worker-1", answer
    expired = mint(kube, namespace, "trainer", lifetime_s=60, audience=OPERATOR_AUDIENCE, pod="train-worker-1",
                   issued_ago_s=600)
    status, answer = push(expired)
    assert status == 401 and "expired" in answer["error"], answer

    # The pod goes: its token goes with it.
    late = mint(kube, namespace, "trainer", lifetime_s=600, audience=OPERATOR_AUDIENCE, pod="train-worker-0")
    kube.kubectl("delete", "pod", "train-worker-0", "-n", namespace, "--wait=true")
    status, answer = push(late)
    assert status == 401, answer
    metrics = running_operator.metrics()
    assert 'frscope_operator_pushes_total{result="rejected"}' in metrics


# -- the web UI ------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_the_web_ui_needs_a_token_with_access_to_the_namespace(kube: ControlPlane, namespace: str,
                                                               running_operator: OperatorProcess) -> None:
    kube.apply(pytorchjob(namespace))
    set_job_conditions(kube, namespace, training_conditions("Created", "Running"))
    base = running_operator.url

    def listed(token: str | None) -> tuple[int, Any]:
        return http("GET", base + "/ui/api/jobs", token=token)

    # Probes and metrics stay open.
    assert http("GET", base + "/healthz")[0] == 200 and http("GET", base + "/metrics")[0] == 200
    assert listed(None)[0] == 401
    assert listed("not-a-token")[0] == 401
    # A reader of the namespace's PyTorchJobs sees the job.
    kube.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    kube.kubectl("create", "role", "jobs-reader", "-n", namespace, "--verb=get,list",
                 "--resource=pytorchjobs.kubeflow.org")
    kube.kubectl("create", "rolebinding", "jobs-reader", "-n", namespace, "--role=jobs-reader",
                 f"--serviceaccount={namespace}:reader")
    reader = request_token(kube, namespace, "reader")
    wait_for("the job listed for its reader",
             lambda: [j["name"] for j in listed(reader)[1]["jobs"] if j["namespace"] == namespace] == [JOB], 30)
    status, _ = http("GET", f"{base}/ui/jobs/{namespace}/{JOB}/summary", token=reader)
    assert status == 200
    # A valid token without any permission: the list hides the namespace, the job page is refused.
    kube.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    nobody = request_token(kube, namespace, "nobody")
    status, answer = listed(nobody)
    assert status == 200 and answer["jobs"] == [], answer
    status, answer = http("GET", f"{base}/ui/jobs/{namespace}/{JOB}/summary", token=nobody)
    assert status == 403 and "may not get pytorchjobs" in answer["error"], answer
    # A token for another audience (e.g. a sidecar's) is not a user's login.
    assert listed(request_token(kube, namespace, "reader", audience=OPERATOR_AUDIENCE))[0] == 401


# -- credentials that rotate -----------------------------------------------------------------------
@pytest.mark.timeout(180)
async def test_the_operators_client_follows_a_rotated_token(kube: ControlPlane, report_crd: str, namespace: str,
                                                            operator_kubeconfig: Path, tmp_path: Path) -> None:
    import kopf

    from frscope.operator.kube import PYTORCHJOBS, Unauthorized
    from frscope.operator.runner import kube_client
    from frscope.operator.serve.login import login

    kube.apply(pytorchjob(namespace))
    token_file = tmp_path / "token"
    first = mint(kube, namespace, "frscope-operator", lifetime_s=600)
    token_file.write_text(first)
    # The kubeconfig names a tokenFile, as a projected token's consumer would (client-go re-reads it too).
    config = json.loads(operator_kubeconfig.read_text())
    config["users"][0]["user"] = {"tokenFile": str(token_file)}
    kubeconfig = tmp_path / "rotating.kubeconfig"
    kubeconfig.write_text(json.dumps(config))
    os.environ["KUBECONFIG"] = str(kubeconfig)
    try:
        credentials = login(kopf.OperatorSettings())
        client = kube_client(credentials, "e2e")
    finally:
        os.environ.pop("KUBECONFIG", None)
    try:
        assert (await client.get(PYTORCHJOBS, namespace, JOB))["metadata"]["name"] == JOB

        # The token in the file expires (it expired 9 minutes ago: past the API server's minute of
        # clock skew): the next request is refused, after one more read of the file found no better one.
        expired = mint(kube, namespace, "frscope-operator", lifetime_s=60, issued_ago_s=600)
        assert authenticated(kube, expired) == 401
        token_file.write_text(expired)
        with pytest.raises(Unauthorized):
            await client.get(PYTORCHJOBS, namespace, JOB)

        # The kubelet's rotation: a new token in the same file. The next request carries it.
        second = mint(kube, namespace, "frscope-operator", lifetime_s=600)
        token_file.write_text(second)
        assert (await client.get(PYTORCHJOBS, namespace, JOB))["metadata"]["name"] == JOB

        # A rotation the file's stamp does not show (same inode, size and mtime): the 401 makes the
        # client read the file again and try once more.
        stale = mint(kube, namespace, "frscope-operator", lifetime_s=60, issued_ago_s=600)
        third = mint(kube, namespace, "frscope-operator", lifetime_s=600)
        assert len(stale) == len(third)
        token_file.write_text(stale)
        with pytest.raises(Unauthorized):
            await client.get(PYTORCHJOBS, namespace, JOB)
        stamp = token_file.stat()
        with token_file.open("r+") as f:
            f.write(third)
        os.utime(token_file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        assert token_file.stat().st_mtime_ns == stamp.st_mtime_ns and token_file.stat().st_ino == stamp.st_ino
        assert (await client.get(PYTORCHJOBS, namespace, JOB))["metadata"]["name"] == JOB

        # kopf's login handler reads the credentials again at every login (kopf calls it after a 401).
        os.environ["KUBECONFIG"] = str(kubeconfig)
        try:
            assert login(kopf.OperatorSettings()).info.token == third
        finally:
            os.environ.pop("KUBECONFIG", None)
    finally:
        await client.close()


# -- the sidecar checks the operator's token offline -----------------------------------------------
@pytest.mark.timeout(120)
async def test_the_sidecar_accepts_the_operators_token_only(kube: ControlPlane, namespace: str,
                                                           tmp_path: Path) -> None:
    import aiohttp

    from frscope.operator.evidence.sidecars import SidecarClient, SidecarError
    from frscope.operator.kube import TokenFile

    for account in ("operator", "trainer"):
        kube.kubectl("create", "serviceaccount", account, "-n", namespace)
    # The training pods' account has no permission of its own: no TokenReview for it.
    trainer = f"system:serviceaccount:{namespace}:trainer"
    assert kube.kubectl("auth", "can-i", "create", "tokenreviews", f"--as={trainer}",
                        check=False).stdout.strip() == "no"
    # What the webhook's projected volume holds (tests/unit/operator/test_webhook.py).
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "api-token").write_text(request_token(kube, namespace, "trainer"))
    (tokens / "operator-token").write_text(request_token(kube, namespace, "trainer", audience=OPERATOR_AUDIENCE))
    (tokens / "ca.crt").write_bytes(kube.ca_file.read_bytes())
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    port_file = tmp_path / "port"
    log = open(tmp_path / "sidecar.log", "wb")  # closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(sockets), "--evidence-dir", "none",
         "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), "--pod", "train-worker-0",
         "--namespace", namespace, "--operator-identity", f"system:serviceaccount:{namespace}:operator",
         "--kube-token-dir", str(tokens), "--api-server", kube.server],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        port = int(wait_for("the sidecar's port", lambda: port_file.exists() and port_file.read_text().strip(), 60))
        base = f"http://127.0.0.1:{port}"

        def status(token: str | None) -> tuple[int, Any]:
            return http("GET", base + "/v1/status", token=token)

        # What the operator mints for this pod (TokenRequest, the audience naming the pod).
        own_audience = f"{SIDECAR_AUDIENCE}/{namespace}/train-worker-0"
        operator_token = request_token(kube, namespace, "operator", audience=own_audience)
        code, answer = status(operator_token)
        assert code == 200 and answer["pod"] == "train-worker-0", answer
        assert http("GET", base + "/healthz")[0] == 200 and http("GET", base + "/metrics")[0] == 200
        refused = {
            "no token": (status(None), 401),
            "the API server's audience": (status(request_token(kube, namespace, "operator")), 401),
            "the operator's own audience": (status(request_token(kube, namespace, "operator",
                                                                  audience=OPERATOR_AUDIENCE)), 401),
            "the shared sidecar audience": (status(request_token(kube, namespace, "operator",
                                                                  audience=SIDECAR_AUDIENCE)), 401),
            "another pod's audience": (status(request_token(kube, namespace, "operator",
                                                             audience=f"{SIDECAR_AUDIENCE}/{namespace}/other")), 401),
            "another account": (status(request_token(kube, namespace, "trainer", audience=own_audience)), 403),
            "expired": (status(mint(kube, namespace, "operator", lifetime_s=60, audience=own_audience,
                                    issued_ago_s=600)), 401),
            "forged": (status(forged(operator_token)), 401),
        }
        for what, ((code, answer), expected) in refused.items():
            assert code == expected, (what, answer)
        # The operator's client, with its projected token file.
        token_file = tmp_path / "operator-sidecar-token"
        token_file.write_text(operator_token)
        async with aiohttp.ClientSession() as session:
            got = await SidecarClient(session, auth=TokenFile(token_file)).status(base, 10)
            assert got.pod == "train-worker-0"
            with pytest.raises(SidecarError, match="HTTP 401"):
                await SidecarClient(session).status(base, 10)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def forged(token: str) -> str:
    """The same header and claims, signed with a key of our own (same kid)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    header, claims, _ = token.split(".")
    key = ec.generate_private_key(ec.SECP256R1())
    r, s = decode_dss_signature(key.sign(f"{header}.{claims}".encode(), ec.ECDSA(hashes.SHA256())))
    sig = base64.urlsafe_b64encode(r.to_bytes(32, "big") + s.to_bytes(32, "big")).rstrip(b"=").decode()
    return f"{header}.{claims}.{sig}"


# -- the whole hop: a real sidecar pushes with its pod's token, the real operator takes it -------
@pytest.mark.timeout(120)
def test_a_sidecar_pushes_with_its_pods_token(kube: ControlPlane, namespace: str,
                                              running_operator: OperatorProcess, tmp_path: Path) -> None:
    import shutil

    kube.kubectl("create", "serviceaccount", "trainer", "-n", namespace)
    training_pod(kube, namespace, "train-worker-0", "trainer")
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    # What the kubelet projects (the webhook's volume): the pod's token for the operator's audience.
    (tokens / "operator-token").write_text(
        request_token(kube, namespace, "trainer", audience=OPERATOR_AUDIENCE, pod="train-worker-0"))
    (tokens / "api-token").write_text(request_token(kube, namespace, "trainer"))
    (tokens / "ca.crt").write_bytes(kube.ca_file.read_bytes())
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    port_file = tmp_path / "port"
    log = open(tmp_path / "sidecar.log", "wb")  # closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(tmp_path), "--dump-dir", str(dumps),
         "--dump-settle", "0.5", "--dump-scan-interval", "0.5", "--evidence-dir", "none", "--host", "127.0.0.1",
         "--port", "0", "--port-file", str(port_file),
         "--pod", "train-worker-0", "--namespace", namespace,
         "--operator-identity", f"system:serviceaccount:{namespace}:frscope-operator",
         "--kube-token-dir", str(tokens), "--api-server", kube.server, "--operator-url", running_operator.url],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        wait_for("the sidecar's port", lambda: port_file.exists() and port_file.read_text().strip(), 60)
        # An on-timeout dump appears: the sidecar parses it and pushes.
        shutil.copy(ROOT / "tests" / "data" / "real" / "hang-pickle" / "nccl_trace_rank_1", dumps / "nccl_trace_rank_1")
        wait_for("the push accepted by the operator",
                 lambda: 'frscope_operator_pushes_total{result="accepted"} 1.0' in running_operator.metrics(), 60,
                 diagnostics=lambda: (tmp_path / "sidecar.log").read_text(errors="replace")[-3000:])
        assert f"push from {namespace}/train-worker-0 by system:serviceaccount:{namespace}:trainer" in (
            running_operator.logs())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
