"""`frscope doctor`'s kubeconfig loading (the `kubernetes` package's loader) on kubeconfig files written here:
tokens, real exec-plugin programs (run by the loader, again once their credential expired), an OIDC
auth-provider, merged `KUBECONFIG=a:b` lists, in-cluster service accounts, and what is refused, by name.
The same loading against the real API server: tests/e2e/test_doctor_e2e.py."""

from __future__ import annotations

import base64
import datetime
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from frscope.doctor import kubeconfig

pytestmark = pytest.mark.timeout(60)

EXEC_API = "client.authentication.k8s.io/v1beta1"


def _self_signed() -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "doctor-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.fixture(scope="module")
def pem() -> tuple[bytes, bytes]:
    return _self_signed()


def _config(*, user: dict[str, Any] | None = None, cluster: dict[str, Any] | None = None,
            context: dict[str, Any] | None = None, current: str | None = "c") -> dict[str, Any]:
    config: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    if current:
        config["current-context"] = current
    if context is not None:
        config["contexts"] = [{"name": "c", "context": context}]
    if cluster is not None:
        config["clusters"] = [{"name": "k", "cluster": cluster}]
    if user is not None:
        config["users"] = [{"name": "u", "user": user}]
    return config


def _write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def _whole(path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    return _write(path, _config(user=user, cluster=cluster or {"server": "https://h:6443"},
                                context={"cluster": "k", "user": "u"}))


def _plugin(directory: Path, body: str) -> Path:
    """An exec plugin: a real program the loader runs, as kubectl runs `aws eks get-token`."""
    script = directory / "credential-plugin"
    script.write_text(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _exec_user(plugin: Path, *args: str) -> dict[str, Any]:
    return {"exec": {"apiVersion": EXEC_API, "command": str(plugin), "args": list(args),
                     "interactiveMode": "Never"}}


def test_a_token_file_and_ca_data(tmp_path: Path, pem: tuple[bytes, bytes]) -> None:
    (tmp_path / "token").write_text("abc\n")
    config = _whole(tmp_path / "config", {"tokenFile": "token"},
                    {"server": "https://h:6443", "certificate-authority-data": base64.b64encode(pem[0]).decode()})
    access = kubeconfig.load(config)
    assert (access.server, access.auth.token(), access.context) == ("https://h:6443", "abc", "c")
    assert access.ssl_context is not False


def test_an_exec_plugin_token_is_used_and_fetched_again_once_expired(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    plugin = _plugin(tmp_path, f"""
runs = {str(runs)!r}
n = len(open(runs).read()) + 1 if os.path.exists(runs) else 1
open(runs, "a").write("x")
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["kind"] == "ExecCredential", info
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                  "status": {{"token": sys.argv[1] + str(n), "expirationTimestamp": "2000-01-01T00:00:00Z"}}}}))
""")
    access = kubeconfig.load(_whole(tmp_path / "config", _exec_user(plugin, "tok-")))
    first = access.auth.token()
    # An expired credential: the next request's token comes from running the plugin again.
    second = access.auth.token()
    assert first is not None and first.startswith("tok-") and second is not None and second.startswith("tok-")
    assert first != second
    assert len(runs.read_text()) >= 2


def test_an_exec_plugin_with_a_client_certificate(tmp_path: Path, pem: tuple[bytes, bytes]) -> None:
    cert, key = pem
    credential = {"apiVersion": EXEC_API, "kind": "ExecCredential",
                  "status": {"clientCertificateData": cert.decode(), "clientKeyData": key.decode()}}
    plugin = _plugin(tmp_path, f"print({json.dumps(json.dumps(credential))})")
    access = kubeconfig.load(_whole(tmp_path / "config", _exec_user(plugin)))
    assert access.auth.token() is None  # the certificate authenticates
    assert access.ssl_context is not False


def test_a_failing_exec_plugin_is_named_with_its_message(tmp_path: Path) -> None:
    plugin = _plugin(tmp_path, "sys.stderr.write('the SSO session expired: run aws sso login\\n'); sys.exit(3)")
    with pytest.raises(kubeconfig.KubeconfigError, match="process returned 3.*aws sso login"):
        kubeconfig.load(_whole(tmp_path / "config", _exec_user(plugin)))
    garbage = _plugin(tmp_path, "print('not json')")
    with pytest.raises(kubeconfig.KubeconfigError, match="decode process output"):
        kubeconfig.load(_whole(tmp_path / "config", _exec_user(garbage)))


def test_an_oidc_auth_provider_token(tmp_path: Path) -> None:
    exp = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    claims = {"iss": "https://issuer.example", "sub": "ml-user", "exp": exp}
    id_token = jwt.encode(claims, "a-key-of-32-bytes-or-more-for-hs256", algorithm="HS256")
    user = {"auth-provider": {"name": "oidc", "config": {"client-id": "frscope", "id-token": id_token,
                                                         "idp-issuer-url": "https://issuer.example"}}}
    access = kubeconfig.load(_whole(tmp_path / "config", user))
    assert access.auth.token() == id_token


def test_a_merged_kubeconfig_list_takes_the_context_from_one_file_and_the_user_from_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _write(tmp_path / "a", _config(cluster={"server": "https://a:6443", "insecure-skip-tls-verify": True},
                                       context={"cluster": "k", "user": "u"}))
    b = _write(tmp_path / "b", _config(user={"token": "from-b"}, current=None))
    shadowed = _write(tmp_path / "c", _config(user={"token": "from-c"}, cluster={"server": "https://c:6443"},
                                              context={"cluster": "k", "user": "u"}, current="later"))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(a), str(tmp_path / "missing"), str(b), str(shadowed)]))
    access = kubeconfig.load()
    # kubectl's rules: the first file to name a cluster, context or user wins, the first current-context too;
    # files that are not there are skipped
    assert (access.server, access.auth.token(), access.ssl_context, access.context) == (
        "https://a:6443", "from-b", False, "c")
    # --kubeconfig takes a list too
    assert kubeconfig.load(Path(f"{b}{os.pathsep}{shadowed}"), "c").auth.token() == "from-b"
    # the context's file alone: its user is nowhere (the request would go out anonymous)
    with pytest.raises(kubeconfig.KubeconfigError, match="names user 'u', which no file"):
        kubeconfig.load(a)


def test_in_cluster_with_no_kubeconfig(tmp_path: Path, pem: tuple[bytes, bytes],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(pem[0])
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    access = kubeconfig.load(environ=environ, token_file=str(tmp_path / "token"), ca_file=str(tmp_path / "ca.crt"))
    assert (access.server, access.auth.token(), access.context) == ("https://10.96.0.1:443", "sa-token", "in-cluster")
    with pytest.raises(kubeconfig.KubeconfigError, match="not in a pod"):
        kubeconfig.load(environ={})
    with pytest.raises(kubeconfig.KubeconfigError, match="in-cluster.*token file does not exist"):
        kubeconfig.load(environ=environ, token_file=str(tmp_path / "gone"), ca_file=str(tmp_path / "ca.crt"))


def test_problems_are_named(tmp_path: Path) -> None:
    with pytest.raises(kubeconfig.KubeconfigError, match="cannot read"):
        kubeconfig.load(tmp_path / "missing")
    config = _whole(tmp_path / "config", {"token": "t"})
    with pytest.raises(kubeconfig.KubeconfigError, match="no context named 'other'"):
        kubeconfig.load(config, "other")
    no_current = _write(tmp_path / "no-current", _config(user={"token": "t"}, cluster={"server": "https://h"},
                                                         context={"cluster": "k", "user": "u"}, current=None))
    with pytest.raises(kubeconfig.KubeconfigError, match="no current-context"):
        kubeconfig.load(no_current)
    with pytest.raises(kubeconfig.KubeconfigError, match="username and password"):
        kubeconfig.load(_whole(tmp_path / "basic", {"username": "a", "password": "b"}))
    (tmp_path / "not-yaml").write_text("clusters: [\n")
    with pytest.raises(kubeconfig.KubeconfigError, match="not YAML"):
        kubeconfig.load(tmp_path / "not-yaml")
    no_server = _whole(tmp_path / "no-server", {"token": "t"}, {"insecure-skip-tls-verify": True})
    with pytest.raises(kubeconfig.KubeconfigError, match="names no API server"):
        kubeconfig.load(no_server)


def test_tls_server_name_is_said_not_honoured(tmp_path: Path) -> None:
    access = kubeconfig.load(_whole(tmp_path / "config", {"token": "t"},
                                    {"server": "https://10.0.0.1", "tls-server-name": "api.internal",
                                     "insecure-skip-tls-verify": True}))
    assert any("tls-server-name 'api.internal'" in w for w in access.warnings), access.warnings


def test_the_exec_credential_is_json_the_plugin_can_read(tmp_path: Path) -> None:
    """provideClusterInfo: the plugin is told the cluster (EKS' and kubelogin's plugins read it)."""
    seen = tmp_path / "seen.json"
    plugin = _plugin(tmp_path, f"""
open({str(seen)!r}, "w").write(os.environ["KUBERNETES_EXEC_INFO"])
print(json.dumps({{"apiVersion": "{EXEC_API}", "kind": "ExecCredential", "status": {{"token": "t"}}}}))
""")
    user = _exec_user(plugin)
    user["exec"]["provideClusterInfo"] = True
    kubeconfig.load(_whole(tmp_path / "config", user))
    info = json.loads(seen.read_text())
    assert info["spec"]["cluster"]["server"] == "https://h:6443"
