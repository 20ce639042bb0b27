"""charts/frscope's TLS to the sidecars and the sidecars' NetworkPolicy, rendered by the real helm: the
chart's own CA is one the operator's code loads and issues with; the operator's flags and environment as
rendered give the injected sidecar `--certificate-url` and HTTPS probes; cert-manager's Certificate is a CA
whose Secret the operator mounts; the PodMonitor scrapes over HTTPS. (cert-manager itself cannot run here:
its objects are checked for shape, not issued. The upgrade keeping the CA: test_chart_install.py.)"""

from __future__ import annotations

import base64
import datetime
import os
import ssl
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.chart_tools import CHART, Helm, objects, of_kind, one
except ModuleNotFoundError:
    from chart_tools import CHART, Helm, objects, of_kind, one

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def helm(testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(testenv_bin_dir / "helm", tmp_path_factory.mktemp("helm-home"))


def _operator(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(one(objs, "Deployment")["spec"]["template"]["spec"])


def _config_of(container: dict[str, Any]) -> Any:
    """The OperatorConfig the operator builds from the rendered container's args and env."""
    from frscope.cli import build_parser
    from frscope.operator.command import from_args

    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    args = build_parser("operator").parse_args(container["args"])
    return from_args(args, env=env)


def _handshake(chain: bytes, key: bytes, ca_pem: bytes, name: str) -> None:
    """A real TLS handshake in memory: a server with `chain` + `key`, a client that trusts `ca_pem` alone
    and expects `name` (the operator's client_context). Raises ssl.SSLError when the client refuses."""
    from frscope.operator.evidence.sidecar_tls import client_context

    pem = Path(os.environ.get("TMPDIR", "/tmp")) / f"frscope-handshake-{os.getpid()}.pem"
    pem.write_bytes(chain + key)
    try:
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(str(pem))
    finally:
        pem.unlink()
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context(ca_pem).wrap_bio(c_in, c_out, server_hostname=name)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for side, obj in (("client", client), ("server", server)):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError(f"TLS handshake for {name} did not finish: {done}")


def test_tls_is_on_by_default_with_the_charts_own_ca(helm: Helm, tmp_path: Path) -> None:
    from frscope.operator.evidence.sidecar_tls import SidecarCa, server_name
    from frscope.operator.injection import sidecar_container
    from frscope.testing.tls import key_and_csr

    objs = objects(helm)
    secret = one(objs, "Secret", "frs-frscope-sidecar-ca")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key"}
    # What helm's genCA made is a CA that the operator's own code loads and issues with.
    ca_dir = tmp_path / "ca"
    ca_dir.mkdir()
    for key, value in secret["data"].items():
        (ca_dir / key).write_bytes(base64.b64decode(value))
    ca = SidecarCa(ca_dir)
    _key, csr = key_and_csr(asks_for="someone-else.team-b.sidecar.frscope.internal")
    leaf = x509.load_pem_x509_certificates(ca.issue(csr, "team-a", "train-worker-0"))[0]
    ca_cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    leaf.verify_directly_issued_by(ca_cert)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [server_name("team-a", "train-worker-0")]
    assert ca_cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > datetime.timedelta(days=3000)
    # OpenSSL, as the sidecar and the operator run it, accepts what the operator issues under this CA (it
    # picks the issuer by key id: genCA's is a truncated SHA-256, not the SHA-1 of the public key).
    ca_pem = base64.b64decode(secret["data"]["tls.crt"])
    _handshake(*ca.issue_operator("frs-frscope.frscope-system.svc"), ca_pem, "frs-frscope.frscope-system.svc")
    sidecar_key, csr = key_and_csr()
    _handshake(ca.issue(csr, "team-a", "train-worker-0"), sidecar_key, ca_pem,
               server_name("team-a", "train-worker-0"))

    pod = _operator(objs)
    container = pod["containers"][0]
    [volume] = [v for v in pod["volumes"] if v["name"] == "sidecar-ca"]
    assert volume["secret"]["secretName"] == "frs-frscope-sidecar-ca"
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "sidecar-ca"]
    config = _config_of(container)
    assert config.sidecar_ca_dir == Path(mount["mountPath"])
    # The operator, configured as rendered, serves HTTPS for the sidecars under its Service's name, and
    # injects sidecars that push and ask for their certificate there.
    service = "https://frs-frscope.frscope-system.svc:8443"
    assert config.webhook.injection.certificate_url == config.webhook.injection.operator_url == service
    assert (config.https_port, config.operator_https_name) == (8443, "frs-frscope.frscope-system.svc")
    [https] = [p for p in one(objs, "Service")["spec"]["ports"] if p["name"] == "https"]
    assert https["port"] == 8443 and {"name": "https", "containerPort": 8443, "protocol": "TCP"} in container["ports"]
    sidecar = sidecar_container(replace(config.webhook.injection, operator_ca="Q0E="))  # the operator adds its CA
    assert f"--certificate-url={service}" in sidecar["args"] and "--operator-ca=Q0E=" in sidecar["args"]
    assert sidecar["startupProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert sidecar["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_tls_off_renders_no_ca_and_plain_probes(helm: Helm) -> None:
    from frscope.operator.injection import sidecar_container

    objs = objects(helm, sets=["sidecar.tls.enabled=false", "podMonitor.enabled=true"])
    assert [s["metadata"]["name"] for s in of_kind(objs, "Secret")] == ["frs-frscope-webhook-tls"]
    container = _operator(objs)["containers"][0]
    config = _config_of(container)
    assert config.sidecar_ca_dir is None and config.webhook.injection.certificate_url is None
    sidecar = sidecar_container(config.webhook.injection)
    assert "scheme" not in sidecar["startupProbe"]["httpGet"]
    endpoint = one(objs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert "scheme" not in endpoint and "tlsConfig" not in endpoint


def test_cert_manager_issues_the_ca_the_operator_mounts(helm: Helm) -> None:
    objs = objects(helm, sets=["sidecar.tls.certManager.enabled=true", "podMonitor.enabled=true"])
    assert [s["metadata"]["name"] for s in of_kind(objs, "Secret")] == ["frs-frscope-webhook-tls"]
    cert = one(objs, "Certificate", "frs-frscope-sidecar-ca")
    spec = cert["spec"]
    assert spec["isCA"] is True and "cert sign" in spec["usages"]
    assert spec["privateKey"]["rotationPolicy"] == "Never"
    assert spec["issuerRef"] == {"kind": "Issuer", "name": "frs-frscope-sidecar-selfsigned"}
    issuer = one(objs, "Issuer", "frs-frscope-sidecar-selfsigned")
    assert issuer["spec"] == {"selfSigned": {}} and issuer["metadata"]["namespace"] == "frscope-system"
    [volume] = [v for v in _operator(objs)["volumes"] if v["name"] == "sidecar-ca"]
    assert volume["secret"]["secretName"] == spec["secretName"]
    # The PodMonitor scrapes the sidecars' HTTPS (a per-pod name cannot be expected per target).
    endpoint = one(objs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    # A cluster's own issuer instead of the chart's self-signed one (ci/all-on-values.yaml).
    all_on = objects(helm, "all-on")
    assert one(all_on, "Certificate", "frs-frscope-sidecar-ca")["spec"]["issuerRef"] == {
        "kind": "ClusterIssuer", "name": "platform-ca"}
    assert not [i for i in of_kind(all_on, "Issuer") if i["metadata"]["name"].endswith("-sidecar-selfsigned")]


def test_bad_tls_values_are_refused(helm: Helm) -> None:
    for sets, message in ((["sidecar.tls.enabled=maybe"], "/sidecar/tls/enabled"),
                          (["sidecar.tls.caValidityDays=0"], "/sidecar/tls/caValidityDays"),
                          (["sidecar.tls.certManager.issuerRef.kind=Vault"], "/sidecar/tls/certManager/issuerRef")):
        args = ["template", "frs", str(CHART)]
        for s in sets:
            args += ["--set", s]
        proc = helm.run(*args, check=False)
        assert proc.returncode != 0 and message in proc.stderr, (sets, proc.stderr)
