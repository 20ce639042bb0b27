"""HTTPS for the sidecar's port (docs/install.md, "TLS to the sidecars").

Two ways to a certificate:
- `--certificate-url` (what the webhook injects with TLS on): the key is made here, in memory, and never
  leaves the container (it reaches OpenSSL through an anonymous in-memory file); a CSR goes to the
  operator's `/v1/certificate` with the pod's own projected token, and the operator answers with a
  certificate naming this pod (`wire.sidecar_tls_name`). Until the first one arrives the port serves a
  throwaway self-signed certificate, which the kubelet's probes accept and the operator does not: the
  trainer is never held back by an operator that is down. The certificate is asked for again every
  `RENEW_EVERY` (and at half its life, if that is sooner). With an https:// URL the operator's own
  certificate is checked against `--operator-ca` (the CA the webhook handed this pod).
- `--tls-cert-file` / `--tls-key-file`: files (e.g. a mounted Secret), read again when they change.

Either way the server's `ssl.SSLContext` stays the same object: a new certificate is loaded into it and
applies to the next connections.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
import os
import ssl
from collections.abc import Callable
from pathlib import Path

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from frscope import wire

log = logging.getLogger("frscope.sidecar")

RENEW_EVERY = datetime.timedelta(hours=1)
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0
MAX_CHAIN_BYTES = 64 * 1024
FILE_CHECK_S = 60.0


def operator_context(ca_b64: str) -> ssl.SSLContext:
    """Trusts only the CA of `--operator-ca` (base64 of its PEM) when talking to the operator over HTTPS."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                         cadata=base64.b64decode(ca_b64).decode("ascii"))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _load_from_memory(context: ssl.SSLContext, chain_pem: bytes, key_pem: bytes) -> None:
    """`load_cert_chain` reads paths only: an anonymous in-memory file stands in (no disk, no name)."""
    fd = os.memfd_create("frscope-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, chain_pem + key_pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


class OperatorIssued:
    """A key made here and the certificate the operator issued for it (a placeholder until then)."""

    def __init__(self, url: str, token: Callable[[], str | None], *, timeout_s: float = 10.0,
                 operator_ca: ssl.SSLContext | None = None) -> None:
        self.url = url.rstrip("/") + wire.CERTIFICATE_PATH
        self.token = token
        self.timeout_s = timeout_s
        # An https:// URL: the operator's certificate is checked against this (else the system's CAs).
        self.ssl: ssl.SSLContext | bool = operator_ca if operator_ca is not None else True
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._key_pem = self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption())
        self.context = server_context()
        self.issued: x509.Certificate | None = None
        _load_from_memory(self.context, self._placeholder(), self._key_pem)

    def _placeholder(self) -> bytes:
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "frscope sidecar (not issued yet)")])
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self._key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1)).sign(self._key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM)

    def csr(self) -> bytes:
        request = (x509.CertificateSigningRequestBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "frscope sidecar")]))
                   .sign(self._key, hashes.SHA256()))
        return request.public_bytes(serialization.Encoding.PEM)

    def install(self, chain_pem: bytes) -> x509.Certificate:
        """Serve `chain_pem` (the operator's answer) from now on. ValueError when it is not a certificate
        for this key."""
        certs = x509.load_pem_x509_certificates(chain_pem)
        leaf = certs[0]
        ours = self._key.public_key().public_bytes(serialization.Encoding.DER,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
        if leaf.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo) != ours:
            raise ValueError("the certificate is not for this sidecar's key")
        _load_from_memory(self.context, chain_pem, self._key_pem)
        self.issued = leaf
        return leaf

    async def request(self, session: aiohttp.ClientSession) -> x509.Certificate:
        headers = {"Content-Type": "application/pkcs10"}
        token = self.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with session.post(self.url, data=self.csr(), headers=headers, ssl=self.ssl,
                                timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
            body = await resp.content.read(MAX_CHAIN_BYTES + 1)
            if resp.status != 200:
                text = " ".join(body[:300].decode("utf-8", "replace").split())
                raise ValueError(f"HTTP {resp.status}: {text}")
        if len(body) > MAX_CHAIN_BYTES:
            raise ValueError(f"answer larger than {MAX_CHAIN_BYTES} bytes")
        return self.install(body)

    def next_renewal_s(self, now: datetime.datetime | None = None) -> float:
        assert self.issued is not None
        now = now or datetime.datetime.now(datetime.UTC)
        half_life = (self.issued.not_valid_after_utc - now) / 2
        return max(RETRY_FIRST_S, min(RENEW_EVERY, half_life).total_seconds())

    async def run(self) -> None:
        """Ask for the certificate now and again before it ends; on failure again after 1, 2, 4 ... 60 s."""
        retry = RETRY_FIRST_S
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    leaf = await self.request(session)
                except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                    log.warning("TLS: no certificate from %s (%s); again in %g s", self.url,
                                f"{type(exc).__name__}: {exc}".rstrip(": "), retry)
                    await asyncio.sleep(retry)
                    retry = min(RETRY_MAX_S, retry * 2)
                    continue
                retry = RETRY_FIRST_S
                log.info("TLS: serving the certificate for %s, valid until %s",
                         ", ".join(_names(leaf)), leaf.not_valid_after_utc.isoformat())
                await asyncio.sleep(self.next_renewal_s())


class FromFiles:
    """A certificate and key from files, loaded again when either changes."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.paths = (cert_file, key_file)
        self.context = server_context()
        self._stamp = self._stat()
        self.context.load_cert_chain(str(cert_file), str(key_file))

    def _stat(self) -> tuple[float, float, int, int]:
        a, b = (os.stat(p) for p in self.paths)
        return (a.st_mtime, b.st_mtime, a.st_ino, b.st_ino)

    def reload(self) -> bool:
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self.context.load_cert_chain(str(self.paths[0]), str(self.paths[1]))
        self._stamp = stamp
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FILE_CHECK_S)
            try:
                if await asyncio.to_thread(self.reload):
                    log.info("TLS: %s loaded again", self.paths[0])
            except (OSError, ssl.SSLError) as exc:  # mid-update: the next check tries again
                log.warning("TLS: %s not loaded again: %s", self.paths[0], exc)


def _names(cert: x509.Certificate) -> list[str]:
    try:
        return list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                    .get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        return [cert.subject.rfc4514_string()]


ServingTls = OperatorIssued | FromFiles
