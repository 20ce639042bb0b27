"""The operator's sidecar CA (frscope.operator.evidence.sidecar_tls), the settings that switch TLS on, and
the injected sidecar with TLS (docs/install.md, "TLS to the sidecars"). The round trip with a real sidecar:
tests/integration/test_sidecar_tls.py; the issuing over the real API server: tests/e2e/test_sidecar_tls_e2e.py."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from frscope.operator.engine.settings import OperatorConfig, WebhookConfig
from frscope.operator.evidence.sidecar_tls import CertificateRefused, SidecarCa, server_name
from frscope.operator.injection import InjectionConfig, inject, sidecar_as_injected
from frscope.testing.tls import key_and_csr, write_ca


def _names(chain: bytes) -> list[str]:
    leaf = x509.load_pem_x509_certificates(chain)[0]
    return list(leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                .get_values_for_type(x509.DNSName))


def test_the_certificate_names_the_pod_the_operator_says_not_the_csr(tmp_path: Path) -> None:
    ca = SidecarCa(write_ca(tmp_path / "ca"))
    _key, csr = key_and_csr(asks_for=server_name("team-b", "their-pod"))
    chain = ca.issue(csr, "team-a", "train-worker-0")
    assert _names(chain) == ["train-worker-0.team-a.sidecar.frscope.internal"]
    leaf, issuer = x509.load_pem_x509_certificates(chain)
    leaf.verify_directly_issued_by(issuer)
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc <= datetime.timedelta(hours=24, minutes=5)


def test_a_csr_that_is_garbage_forged_or_weak_is_refused(tmp_path: Path) -> None:
    ca = SidecarCa(write_ca(tmp_path / "ca"))
    with pytest.raises(CertificateRefused, match="not a PEM certificate request"):
        ca.issue(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", "ns", "p")
    with pytest.raises(CertificateRefused, match="larger than"):
        ca.issue(b"x" * (64 * 1024), "ns", "p")
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])).sign(weak, hashes.SHA256()))
    with pytest.raises(CertificateRefused, match="fewer than 2048 bits"):
        ca.issue(csr.public_bytes(serialization.Encoding.PEM), "ns", "p")
    # A CSR whose signature does not hold: whoever sent it does not have the key.
    _key, good = key_and_csr()
    der = bytearray(x509.load_pem_x509_csr(good).public_bytes(serialization.Encoding.DER))
    der[-3] ^= 0xFF
    forged = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CertificateRefused, match="signature does not hold"):
        ca.issue(forged, "ns", "p")


def test_a_ca_that_is_no_ca_or_whose_key_differs_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a CA certificate"):
        SidecarCa(write_ca(tmp_path / "leaf", ca=False))
    mixed = write_ca(tmp_path / "mixed")
    (mixed / "tls.key").write_bytes((write_ca(tmp_path / "other") / "tls.key").read_bytes())
    with pytest.raises(ValueError, match="not the key of tls.crt"):
        SidecarCa(mixed)
    with pytest.raises(FileNotFoundError):
        SidecarCa(tmp_path / "missing")


def test_a_replaced_ca_is_read_again(tmp_path: Path) -> None:
    directory = write_ca(tmp_path / "ca", name="first")
    ca = SidecarCa(directory)
    first = ca.ca_pem
    replacement = write_ca(tmp_path / "next", name="second")
    for name in ("tls.crt", "tls.key"):  # as the kubelet swaps a Secret volume: new files, new inodes
        os.replace(replacement / name, directory / name)
    second = ca.ca_pem
    assert second != first
    _key, csr = key_and_csr()
    issuer = x509.load_pem_x509_certificates(ca.issue(csr, "ns", "p"))[1]
    assert issuer.subject.rfc4514_string() == "CN=second"
    # Half-written files (mid-rotation) keep the CA read last.
    (directory / "tls.crt").write_text("not yet")
    assert ca.ca_pem == second


def test_tls_settings_need_pod_identity_and_the_url_the_sidecars_ask(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs --sidecar-auth kubernetes"):
        OperatorConfig(sidecar_auth="none", sidecar_ca_dir=tmp_path)
    with pytest.raises(ValueError, match="FRSCOPE_SIDECAR_CERTIFICATE_URL"):
        OperatorConfig(sidecar_ca_dir=tmp_path, webhook=WebhookConfig(injection=InjectionConfig()))
    with pytest.raises(ValueError, match="shared secret of --sidecar-auth token"):
        OperatorConfig(sidecar_token_file=tmp_path / "token")  # the chart's old shared-audience token


def test_a_tls_injected_sidecar_is_trusted_as_injected() -> None:
    cfg = InjectionConfig(operator_identity="system:serviceaccount:frscope:frscope",
                          certificate_url="http://frscope.frscope.svc:80")
    pod = {"metadata": {"name": "w-0", "namespace": "ml", "labels": {"frscope.io/inject": "true"}},
           "spec": {"containers": [{"name": "pytorch", "image": "train:1"}]}}
    out = inject(pod, cfg)
    assert out is not None
    [sidecar] = out["spec"]["initContainers"]
    assert "--certificate-url=http://frscope.frscope.svc:80" in sidecar["args"]
    assert sidecar["startupProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert sidecar_as_injected(out, cfg) is None  # no new mount or variable the operator would distrust


def test_the_operators_https_needs_the_ca_and_a_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--https-port needs --sidecar-ca-dir"):
        OperatorConfig(https_port=8443)
    injection = InjectionConfig(certificate_url="https://frs-frscope.frscope-system.svc:8443")
    config = OperatorConfig(https_port=8443, sidecar_ca_dir=tmp_path, webhook=WebhookConfig(injection=injection))
    assert config.operator_https_name == "frs-frscope.frscope-system.svc"  # the name the sidecars connect to
    assert OperatorConfig(https_port=1, https_name="10.0.0.1", sidecar_ca_dir=tmp_path).operator_https_name == \
        "10.0.0.1"


def test_the_operators_own_certificate_names_its_service_or_address(tmp_path: Path) -> None:
    ca = SidecarCa(write_ca(tmp_path / "ca"))
    for name, kind in (("frs-frscope.frscope-system.svc", x509.DNSName), ("127.0.0.1", x509.IPAddress)):
        chain, key = ca.issue_operator(name)
        leaf = x509.load_pem_x509_certificates(chain)[0]
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(v) for v in sans.get_values_for_type(kind)] == [name]
        assert serialization.load_pem_private_key(key, None).public_key() == leaf.public_key()
