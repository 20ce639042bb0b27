"""Does a webhook's caBundle trust the serving certificate the operator presents? Pure: PEM in, problems out."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature


def _load_all(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def serving_cert_problems(ca_bundle_pem: bytes, serving_pem: bytes, dns_name: str,
                          now: datetime.datetime | None = None) -> list[str]:
    """Problems that make the API server refuse the webhook's certificate; empty when it would accept it.

    Checks: the bundle parses, some CA in it signed the serving certificate, the certificate is valid
    now, and it names `dns_name` (`<service>.<namespace>.svc`) among its DNS names.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        cas = _load_all(ca_bundle_pem)
    except ValueError as e:
        return [f"the caBundle is not PEM certificates: {e}"]
    try:
        [leaf, *_] = _load_all(serving_pem)
    except ValueError as e:
        return [f"the serving certificate is not PEM: {e}"]
    problems = []
    if not any(_issued_by(leaf, ca) for ca in cas):
        problems.append("the caBundle did not sign the serving certificate (issuer "
                        f"{leaf.issuer.rfc4514_string()!r})")
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        problems.append(f"the serving certificate is valid {leaf.not_valid_before_utc:%Y-%m-%d} to "
                        f"{leaf.not_valid_after_utc:%Y-%m-%d}, not now")
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = names.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    if dns_name not in dns:
        problems.append(f"the serving certificate does not name {dns_name} (it names {', '.join(dns) or 'nothing'})")
    return problems


def _issued_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def sidecar_ca_problems(cert_pem: bytes, key_pem: bytes, now: datetime.datetime | None = None,
                        min_left: datetime.timedelta = datetime.timedelta(days=30)) -> list[str]:
    """Problems of the CA with which the operator issues the sidecars' certificates (sidecar.tls); empty
    when it is a CA, its key matches, and it is valid now for at least `min_left`."""
    from cryptography.hazmat.primitives import serialization

    now = now or datetime.datetime.now(datetime.UTC)
    try:
        [cert, *_] = _load_all(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:
        return [f"not a PEM certificate and key: {e}"]
    problems = []
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        problems.append("tls.crt is not a CA certificate")
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(serialization.Encoding.DER, spki) != \
            key.public_key().public_bytes(serialization.Encoding.DER, spki):
        problems.append("tls.key is not the key of tls.crt")
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        problems.append(f"the CA is valid {cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d}, "
                        "not now")
    elif cert.not_valid_after_utc - now < min_left:
        problems.append(f"the CA expires on {cert.not_valid_after_utc:%Y-%m-%d}")
    return problems
