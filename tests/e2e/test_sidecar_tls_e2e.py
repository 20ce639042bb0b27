"""TLS between the operator and a sidecar, the whole hop on the real API server (testenv): a real sidecar
asks the real operator (`--sidecar-ca-dir`, the chart's RBAC) for its certificate with its pod-bound
token; the operator learns the pod from the API server's TokenReview, reads the pod, and issues a
certificate naming that pod whatever the CSR asks for; the operator's client then reads the sidecar over
HTTPS as that pod, and refuses to as another. Tokens not bound to a pod, or none, get no certificate."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.e2e.sa_tokens import request_token
from tests.e2e.test_auth_e2e import OPERATOR_AUDIENCE, http, training_pod
from tests.e2e.test_operator_e2e import (  # noqa: F401  (fixtures used by name)
    ROOT,
    OperatorProcess,
    chart_rbac,
    free_port,
    namespace,
    operator_kubeconfig,
    wait_for,
)

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    from frscope.testing.tls import write_ca

    return write_ca(tmp_path / "sidecar-ca")


@pytest.fixture
def tls_operator(kube: ControlPlane, operator_kubeconfig: Path, ca_dir: Path,
                 tmp_path: Path) -> Iterator[tuple[OperatorProcess, str]]:
    """The operator with TLS to the sidecars; also its HTTPS URL."""
    https_port = free_port()
    proc = OperatorProcess(kube, operator_kubeconfig, tmp_path / "operator.log",
                           ["--poll-interval", "30", "--sidecar-ca-dir", str(ca_dir), "--https-port", str(https_port),
                            "--https-name", "127.0.0.1"])
    try:
        proc.wait_ready()
        yield proc, f"https://127.0.0.1:{https_port}"
    finally:
        proc.stop()


@pytest.mark.timeout(180)
async def test_a_sidecar_gets_its_pods_certificate_and_only_its_pod_is_read(
        kube: ControlPlane, namespace: str, tls_operator: tuple[OperatorProcess, str], ca_dir: Path,
        tmp_path: Path) -> None:
    import aiohttp

    from frscope.operator.evidence.sidecar_tls import SidecarCa, server_name
    from frscope.operator.evidence.sidecars import SidecarClient, SidecarError
    from frscope.operator.kube import StaticToken
    from frscope.testing.tls import key_and_csr
    from frscope.wire import CERTIFICATE_PATH, sidecar_audience

    operator, https_url = tls_operator
    kube.kubectl("create", "serviceaccount", "trainer", "-n", namespace)
    training_pod(kube, namespace, "train-worker-0", "trainer")
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    # What the webhook's projected volume holds: the pod's own token for the operator's audience.
    pod_token = request_token(kube, namespace, "trainer", audience=OPERATOR_AUDIENCE, pod="train-worker-0")
    (tokens / "operator-token").write_text(pod_token)
    (tokens / "api-token").write_text(request_token(kube, namespace, "trainer"))
    (tokens / "ca.crt").write_bytes(kube.ca_file.read_bytes())
    identity = f"system:serviceaccount:{namespace}:frscope-operator"
    port_file = tmp_path / "port"
    sidecar_log = tmp_path / "sidecar.log"
    out = open(sidecar_log, "wb")  # closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(tmp_path), "--evidence-dir", "none",
         "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), "--pod", "train-worker-0",
         "--namespace", namespace, "--operator-identity", identity, "--kube-token-dir", str(tokens),
         "--api-server", kube.server, "--certificate-url", https_url,
         "--operator-ca", base64.b64encode((ca_dir / "tls.crt").read_bytes()).decode()],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        port = int(wait_for("the sidecar's port", lambda: port_file.exists() and port_file.read_text().strip(), 60))
        wait_for("the certificate issued by the operator",
                 lambda: "TLS: serving the certificate for" in sidecar_log.read_text(errors="replace"), 60,
                 diagnostics=lambda: sidecar_log.read_text(errors="replace")[-3000:] + operator.logs())
        assert server_name(namespace, "train-worker-0") in sidecar_log.read_text()
        base = f"http://127.0.0.1:{port}"
        ca = SidecarCa(ca_dir)
        shown = request_token(kube, namespace, "frscope-operator", audience=sidecar_audience(namespace,
                                                                                             "train-worker-0"))
        async with aiohttp.ClientSession() as session:
            client = SidecarClient(session, auth=StaticToken(shown), tls=ca)
            status = await client.status(base, 10, pod=(namespace, "train-worker-0"))
            assert (status.namespace, status.pod) == (namespace, "train-worker-0")
            # The operator believing this address is another pod's: its certificate does not name it.
            with pytest.raises(SidecarError, match="TLS: the sidecar's certificate is refused.*[Hh]ostname mismatch"):
                await client.status(base, 10, pod=(namespace, "train-worker-1"))
        assert "certificate issued to " + f"{namespace}/train-worker-0" in operator.logs()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        out.close()

    # The operator's HTTPS carries a certificate of the sidecar CA for its name; another CA refuses it.
    from frscope.testing.tls import write_ca

    trusting = ssl.create_default_context(cafile=str(ca_dir / "tls.crt"))
    with urllib.request.urlopen(https_url + "/healthz", context=trusting,
                                timeout=10) as answer:
        assert answer.status == 200
    stranger = ssl.create_default_context(cafile=str(write_ca(tmp_path / "stranger") / "tls.crt"))
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(https_url + "/healthz", context=stranger, timeout=10)
    url = operator.url + CERTIFICATE_PATH
    _key, csr = key_and_csr(asks_for=server_name(namespace, "train-worker-1"))
    # A CSR asking for another pod's name gets its own pod's name: the operator decides the name.
    code, answer = http("POST", url, token=pod_token, body=csr)
    assert code == 200, answer
    from cryptography import x509

    leaf = x509.load_pem_x509_certificates(answer.encode())[0]
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [server_name(namespace, "train-worker-0")]
    # A token for the operator's audience that is bound to no pod, and no token at all: no certificate.
    unbound = request_token(kube, namespace, "trainer", audience=OPERATOR_AUDIENCE)
    assert http("POST", url, token=unbound, body=csr)[0] == 403
    assert http("POST", url, body=csr)[0] == 401
    # The pod gone: its token is no longer accepted, nor a certificate issued.
    kube.kubectl("delete", "pod", "train-worker-0", "-n", namespace, "--wait=false")
    wait_for("the pod deleted", lambda: kube.kubectl("get", "pod", "train-worker-0", "-n", namespace,
                                                     check=False).returncode != 0, 30)
    assert http("POST", url, token=pod_token, body=csr)[0] in (401, 403)
