"""TLS between the operator and the sidecars (docs/install.md, "TLS to the sidecars").

The operator holds a CA (`--sidecar-ca-dir`: tls.crt and tls.key, the chart's Secret or cert-manager's)
and is the only issuer of the sidecars' serving certificates: a sidecar makes its key in memory, sends a
CSR with its pod-bound service-account token, and gets a certificate whose one name is
`wire.sidecar_tls_name(namespace, pod)` for the pod the token names (never what the CSR asks for).
When the operator connects to a pod's sidecar it trusts this CA only and expects exactly that pod's
name, so a certificate, or a key, of one pod opens no other pod's connection.

The files are read again when they change (cert-manager or an upgrade may replace them).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from frscope import wire

log = logging.getLogger(__name__)

# A sidecar's certificate lives this long; the sidecar asks again well before (frscope.sidecar.tls).
CERT_LIFETIME = datetime.timedelta(hours=24)
# A CSR is a few hundred bytes; one past this is refused unread.
MAX_CSR_BYTES = 16 * 1024
_BACKDATE = datetime.timedelta(minutes=5)  # clock skew between the operator's node and the sidecar's


_PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey


class CertificateRefused(ValueError):
    """A CSR the operator does not sign (the message says why)."""


@dataclass(frozen=True, slots=True)
class _Loaded:
    stamp: tuple[float, float, int, int]
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
    ca_pem: bytes
    client: ssl.SSLContext


def _stamp(paths: tuple[Path, Path]) -> tuple[float, float, int, int]:
    a, b = (os.stat(p) for p in paths)
    return (a.st_mtime, b.st_mtime, a.st_ino, b.st_ino)


class SidecarCa:
    """The CA of `directory` (tls.crt, tls.key): issues the sidecars' certificates and gives the client
    context that trusts it alone."""

    def __init__(self, directory: Path, *, lifetime: datetime.timedelta = CERT_LIFETIME) -> None:
        self.directory = directory
        self.lifetime = lifetime
        self._paths = (directory / "tls.crt", directory / "tls.key")
        self._loaded: _Loaded | None = None
        self.reload()  # a missing or unusable CA stops the operator at start, with the reason

    def reload(self) -> None:
        """Read the files again when they changed (cheap otherwise: two stat calls)."""
        stamp = _stamp(self._paths)
        if self._loaded is not None and self._loaded.stamp == stamp:
            return
        cert_pem, key_pem = (p.read_bytes() for p in self._paths)
        try:
            cert = x509.load_pem_x509_certificates(cert_pem)[0]
            key = serialization.load_pem_private_key(key_pem, password=None)
        except ValueError as exc:
            raise ValueError(f"{self.directory}: not a PEM certificate and key: {exc}") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey):
            raise ValueError(f"{self.directory}/tls.key: an EC, RSA or Ed25519 key is needed")
        try:
            constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            constraints = None
        if constraints is None or not constraints.ca:
            raise ValueError(f"{self.directory}/tls.crt is not a CA certificate (basicConstraints CA:TRUE)")
        if cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) \
                != key.public_key().public_bytes(serialization.Encoding.DER,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo):
            raise ValueError(f"{self.directory}: tls.key is not the key of tls.crt")
        ca_pem = cert.public_bytes(serialization.Encoding.PEM)
        self._loaded = _Loaded(stamp, cert, key, ca_pem, client_context(ca_pem))
        log.info("sidecar CA %s loaded (%s, valid until %s)", self.directory, cert.subject.rfc4514_string(),
                 cert.not_valid_after_utc.isoformat())

    def _current(self) -> _Loaded:
        try:
            self.reload()
        except (OSError, ValueError) as exc:  # mid-rotation: keep what was read last
            log.warning("sidecar CA %s not re-read: %s", self.directory, exc)
        assert self._loaded is not None
        return self._loaded

    @property
    def ca_pem(self) -> bytes:
        return self._current().ca_pem

    def client_context(self) -> ssl.SSLContext:
        """Trusts this CA only; the caller names the server it expects (`server_name`)."""
        return self._current().client

    def issue(self, csr_pem: bytes, namespace: str, pod: str,
              now: datetime.datetime | None = None) -> bytes:
        """The certificate for `namespace`/`pod` on the CSR's key, then the CA's: PEM. The CSR's names and
        extensions are ignored; its signature must hold (the asker has the key)."""
        if len(csr_pem) > MAX_CSR_BYTES:
            raise CertificateRefused(f"CSR larger than {MAX_CSR_BYTES} bytes")
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as exc:
            raise CertificateRefused(f"not a PEM certificate request: {exc}") from None
        if not csr.is_signature_valid:
            raise CertificateRefused("the CSR's signature does not hold")
        public = csr.public_key()
        if isinstance(public, rsa.RSAPublicKey):
            if public.key_size < 2048:
                raise CertificateRefused("RSA keys of fewer than 2048 bits are refused")
        elif isinstance(public, ec.EllipticCurvePublicKey):
            if public.curve.name not in ("secp256r1", "secp384r1"):
                raise CertificateRefused(f"curve {public.curve.name} is refused (P-256 or P-384)")
        elif not isinstance(public, ed25519.Ed25519PublicKey):
            raise CertificateRefused("an EC (P-256, P-384), RSA or Ed25519 key is needed")
        san: x509.GeneralName = x509.DNSName(wire.sidecar_tls_name(namespace, pod))
        return self._sign(public, san, f"{namespace}/{pod}", "frscope sidecar", now)

    def issue_operator(self, name: str) -> tuple[bytes, bytes]:
        """The operator's own HTTPS certificate (its Service name, or an address) and its key, made here in
        memory: what the sidecars' pushes and certificate requests verify (`--operator-ca`)."""
        key = ec.generate_private_key(ec.SECP256R1())
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            san = x509.DNSName(name)
        chain = self._sign(key.public_key(), san, name, "frscope operator", None)
        return chain, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())

    def _sign(self, public: _PublicKey, san: x509.GeneralName, common_name: str, organization: str,
              now: datetime.datetime | None) -> bytes:
        loaded = self._current()
        now = now or datetime.datetime.now(datetime.UTC)
        not_after = min(now + self.lifetime, loaded.cert.not_valid_after_utc)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64]),
                             x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(loaded.cert.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=isinstance(public, rsa.RSAPublicKey),
                                         content_commitment=False, data_encipherment=False, key_agreement=False,
                                         key_cert_sign=False, crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(_authority_key_id(loaded.cert), critical=False)
        )
        algorithm = None if isinstance(loaded.key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
        cert = builder.sign(loaded.key, algorithm)
        return cert.public_bytes(serialization.Encoding.PEM) + loaded.ca_pem


def _authority_key_id(ca: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    """The key id that names the CA the way the CA names itself: its own SubjectKeyIdentifier when it has
    one (OpenSSL picks an issuer by it; helm's genCA and other Go-made CAs derive it with truncated
    SHA-256, not the SHA-1 `from_issuer_public_key` computes), else the SHA-1 of its public key."""
    try:
        own = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key())  # type: ignore[arg-type]
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(own)


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    """A client context that trusts `ca_pem` alone and checks the server's name (TLS 1.2 at least)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem.decode("ascii"))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class OperatorServing:
    """The operator's HTTPS for the sidecars (`--https-port`): a key and certificate from the sidecar CA,
    made in memory, renewed into the same context (`renew`, hourly, also picks up a replaced CA)."""

    def __init__(self, ca: SidecarCa, name: str) -> None:
        self.ca = ca
        self.name = name
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.renew()

    def renew(self) -> None:
        chain, key = self.ca.issue_operator(self.name)
        fd = os.memfd_create("frscope-tls", os.MFD_CLOEXEC)  # the key on no disk and under no name
        try:
            os.write(fd, chain + key)
            self.context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)

    async def run(self, every_s: float = 3600.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await asyncio.to_thread(self.renew)
            except (OSError, ValueError, ssl.SSLError) as exc:
                log.warning("the operator's HTTPS certificate not renewed: %s", exc)


def server_name(namespace: str, pod: str) -> str:
    """The one name the operator accepts from `namespace`/`pod`'s sidecar."""
    return wire.sidecar_tls_name(namespace, pod)
