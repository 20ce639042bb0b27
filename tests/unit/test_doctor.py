"""The pure parts of `frscope doctor`: the certificate check (on real certificates made here), the
NetworkPolicy verdict, pod injection and readiness, results and exit codes (the kubeconfig loader:
test_doctor_kubeconfig.py).
The checks against a cluster are in tests/e2e/test_doctor_e2e.py."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from frscope.doctor import versions
from frscope.doctor.certs import serving_cert_problems
from frscope.doctor.job_checks import not_injected, pytorchjob_templates_opted_in, sidecar_not_ready
from frscope.doctor.policies import shuts_out_prometheus
from frscope.doctor.result import Outcome, exit_code, failed, passed, render_line, skipped

NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
SERVICE = "frscope.frscope-system.svc"


def _cert(subject: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None, *, dns: tuple[str, ...] = (),
          days: int = 30) -> tuple[bytes, x509.Name, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(NOW - datetime.timedelta(days=1)).not_valid_after(NOW + datetime.timedelta(days=days)))
    if dns:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), name, key


@pytest.fixture(scope="module")
def ca() -> tuple[bytes, x509.Name, ec.EllipticCurvePrivateKey]:
    return _cert("frscope-ca", None)


def test_a_serving_certificate_the_bundle_signed_passes(ca: Any) -> None:
    pem, name, key = ca
    serving, _, _ = _cert(SERVICE, (name, key), dns=(SERVICE, "frscope"))
    assert serving_cert_problems(pem, serving, SERVICE, NOW) == []
    other_ca, _, _ = _cert("other-ca", None)
    assert serving_cert_problems(other_ca + pem, serving, SERVICE, NOW) == []  # a bundle of several


def test_a_bundle_of_another_ca_is_named(ca: Any) -> None:
    pem, name, key = ca
    serving, _, _ = _cert(SERVICE, (name, key), dns=(SERVICE,))
    other_ca, _, _ = _cert("other-ca", None)
    [problem] = serving_cert_problems(other_ca, serving, SERVICE, NOW)
    assert "did not sign" in problem and "frscope-ca" in problem


def test_expired_and_misnamed_certificates_are_named(ca: Any) -> None:
    pem, name, key = ca
    serving, _, _ = _cert("x", (name, key), dns=("elsewhere.svc",), days=1)
    problems = serving_cert_problems(pem, serving, SERVICE, NOW + datetime.timedelta(days=10))
    assert any("not now" in p for p in problems)
    assert any(f"does not name {SERVICE}" in p and "elsewhere.svc" in p for p in problems)


def test_garbage_is_a_problem_not_a_crash(ca: Any) -> None:
    assert "not PEM certificates" in serving_cert_problems(b"junk", ca[0], SERVICE, NOW)[0]
    assert "not PEM" in serving_cert_problems(ca[0], b"", SERVICE, NOW)[0]


def _policy(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"ingress": list(rules)}}


OWN = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"frscope.io/inject": "true"}}}
OPERATOR = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "frscope"}}}
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def test_a_policy_admitting_only_frscope_shuts_prometheus_out() -> None:
    assert shuts_out_prometheus(_policy({"from": [OWN], "ports": [{"port": 8080}]}, {"ports": [{"port": 9443}]}))
    assert shuts_out_prometheus(_policy({"from": [OPERATOR], "ports": [{"port": 9402}]}))


def test_a_policy_with_a_prometheus_peer_or_open_rules_admits_it() -> None:
    assert not shuts_out_prometheus(_policy({"from": [OWN, PROMETHEUS], "ports": [{"port": 8080}]}))
    assert not shuts_out_prometheus(_policy({"ports": [{"port": 8080}]}))
    assert not shuts_out_prometheus({"spec": {}})
    # The chart's default Prometheus peer: the Prometheus Operator's pods, named by app.kubernetes.io/name too.
    operator_pods = {"namespaceSelector": PROMETHEUS["namespaceSelector"],
                     "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    assert not shuts_out_prometheus(_policy({"from": [OWN, operator_pods], "ports": [{"port": 8080}]}))
    renamed = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "ml-frscope",
                                               "app.kubernetes.io/component": "operator"}}}
    assert shuts_out_prometheus(_policy({"from": [OWN, renamed], "ports": [{"port": 8080}]}))  # nameOverride


def _pod(name: str, *, annotated: bool = True, native: bool = True, ready: bool | None = True) -> dict[str, Any]:
    sidecar = {"name": "frscope-sidecar"}
    spec: dict[str, Any] = ({"containers": [{"name": "pytorch"}], "initContainers": [sidecar]} if native
                            else {"containers": [{"name": "pytorch"}, sidecar]})
    meta: dict[str, Any] = {"name": name}
    if annotated:
        meta["annotations"] = {"frscope.io/injected": "native-sidecar"}
    status: dict[str, Any] = {}
    if ready is not None:
        status["initContainerStatuses" if native else "containerStatuses"] = [{"name": "frscope-sidecar",
                                                                               "ready": ready}]
    return {"metadata": meta, "spec": spec, "status": status}


def test_injection_needs_the_annotation_and_the_container() -> None:
    plain = {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "pytorch"}]}}
    pods = [_pod("a"), _pod("b", native=False), _pod("c", annotated=False), plain]
    assert not_injected(pods) == ["c", "plain"]


def test_a_sidecar_not_ready_or_not_started_is_named() -> None:
    pods = [_pod("a"), _pod("b", ready=False), _pod("c", ready=None), _pod("d", native=False)]
    assert sidecar_not_ready(pods) == ["b", "c"]


def test_a_job_opts_in_only_when_every_template_is_labelled() -> None:
    labelled = {"template": {"metadata": {"labels": {"frscope.io/inject": "true"}}}}
    job = {"spec": {"pytorchReplicaSpecs": {"Master": labelled, "Worker": labelled}}}
    assert pytorchjob_templates_opted_in(job)
    job["spec"]["pytorchReplicaSpecs"]["Worker"] = {"template": {}}
    assert not pytorchjob_templates_opted_in(job)
    assert not pytorchjob_templates_opted_in({"spec": {}})


def test_exit_codes_and_lines() -> None:
    ok, skip = passed("crd", "fine"), skipped("injected", "no pods")
    bad = failed("webhook", "no endpoint", "kubectl get pods")
    assert exit_code([ok, skip]) == 0
    assert exit_code([ok, bad]) == 1
    assert render_line(ok) == "[  ok] crd: fine"
    assert render_line(bad) == "[FAIL] webhook: no endpoint\n       -> kubectl get pods"
    assert skip.outcome is Outcome.SKIP and not skip.failed


def test_the_tested_versions_table() -> None:
    assert versions.kubernetes_tested((1, 36))
    assert not versions.kubernetes_tested((1, 24))
    assert versions.kubernetes_between_tested((1, 31)) and versions.kubernetes_between_tested((1, 35))
    assert not versions.kubernetes_between_tested((1, 29)) and not versions.kubernetes_between_tested((1, 37))
    assert "1.36" in versions.tested_text()


def test_the_tested_kubernetes_minors_are_the_releases_testenv_builds() -> None:
    """The default release (testenv/go.mod) and each release of the version matrix (testenv/kube/<version>)."""
    testenv = Path(__file__).resolve().parents[2] / "testenv"
    default = re.search(r"^require k8s\.io/kubernetes v(\d+)\.(\d+)\.", (testenv / "go.mod").read_text(), re.M)
    assert default is not None
    built = {(int(default.group(1)), int(default.group(2)))}
    built |= {(int(d.name.split(".")[0]), int(d.name.split(".")[1])) for d in (testenv / "kube").iterdir()
              if (d / "go.mod").is_file()}
    assert set(versions.TESTED_KUBERNETES) == built


def _event(reason: str, when: str, job: str = "llm") -> dict[str, Any]:
    return {"reason": reason, "lastTimestamp": when, "involvedObject": {"name": job}, "message": when}


def test_recent_unreachable_events_of_the_job_newest_first() -> None:
    from frscope.doctor.operator_reach import recent_unreachable

    now = datetime.datetime(2026, 6, 1, 12, 0, tzinfo=datetime.UTC)
    events = [_event("SidecarsUnreachable", "2026-06-01T11:30:00Z"),
              _event("SidecarsUnreachable", "2026-06-01T11:50:00Z"),
              _event("SidecarsUnreachable", "2026-06-01T10:00:00Z"),  # older than an hour
              _event("SidecarsUnreachable", "2026-06-01T11:55:00Z", job="other"),
              _event("RankNotJoined", "2026-06-01T11:59:00Z"),
              {"reason": "SidecarsUnreachable", "lastTimestamp": "garbage"}]
    assert [e["message"] for e in recent_unreachable(events, now, "llm")] == ["2026-06-01T11:50:00Z",
                                                                             "2026-06-01T11:30:00Z"]
    assert len(recent_unreachable(events, now)) == 3


def test_the_sidecar_port_and_a_readyz_answer() -> None:
    from frscope.doctor.ranks_served import ranks_of, sidecar_port

    pod = {"spec": {"initContainers": [{"name": "frscope-sidecar", "ports": [
        {"name": "other", "containerPort": 1}, {"name": "frscope", "containerPort": 9402}]}]}}
    assert sidecar_port(pod) == 9402
    assert sidecar_port({"spec": {"containers": [{"name": "pytorch", "ports": [{"name": "frscope",
                                                                                "containerPort": 9402}]}]}}) is None
    assert ranks_of({"ready": True, "ranks": 8}) == 8
    assert ranks_of({"ready": True, "ranks": 0}) == 0
    assert ranks_of({"ready": False}) is None and ranks_of("503 text") is None
    assert ranks_of({"ready": True, "ranks": "8"}) is None


def test_the_sidecar_ca_must_be_a_ca_with_its_key_and_time_left(tmp_path: Path) -> None:
    import datetime

    from frscope.doctor.certs import sidecar_ca_problems
    from frscope.testing.tls import write_ca

    good = write_ca(tmp_path / "good")
    cert, key = (good / "tls.crt").read_bytes(), (good / "tls.key").read_bytes()
    assert sidecar_ca_problems(cert, key) == []
    leaf = write_ca(tmp_path / "leaf", ca=False)
    assert sidecar_ca_problems((leaf / "tls.crt").read_bytes(), (leaf / "tls.key").read_bytes()) == [
        "tls.crt is not a CA certificate"]
    assert sidecar_ca_problems(cert, (leaf / "tls.key").read_bytes()) == ["tls.key is not the key of tls.crt"]
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3640)
    assert sidecar_ca_problems(cert, key, now=later)[0].startswith("the CA expires on")
    assert sidecar_ca_problems(b"junk", key)[0].startswith("not a PEM certificate and key")
