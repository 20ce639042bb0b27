"""The sidecar's own TLS identity (frscope.sidecar.tls): a key made in memory, a placeholder certificate
until the operator's arrives, and only a certificate for its own key taken. Over real sockets with a
real operator: tests/e2e/test_sidecar_tls_e2e.py."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from frscope.operator.evidence.sidecar_tls import SidecarCa, server_name
from frscope.sidecar.tls import RENEW_EVERY, OperatorIssued
from frscope.testing.tls import key_and_csr, write_ca


async def _handshake(context: ssl.SSLContext, client: ssl.SSLContext, name: str) -> x509.Certificate:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=name)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return x509.load_der_x509_certificate(der)
    finally:
        server.close()
        await server.wait_closed()


async def test_the_placeholder_is_served_until_the_operators_certificate_is_installed(tmp_path: Path) -> None:
    ca = SidecarCa(write_ca(tmp_path / "ca"))
    tls = OperatorIssued("http://operator.invalid", lambda: None)
    name = server_name("ml", "w-0")
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(tls.context, ca.client_context(), name)  # the placeholder: no operator trusts it
    leaf = tls.install(ca.issue(tls.csr(), "ml", "w-0"))
    served = await _handshake(tls.context, ca.client_context(), name)  # the same context, the new certificate
    assert served == leaf
    assert 0 < tls.next_renewal_s(datetime.datetime.now(datetime.UTC)) <= RENEW_EVERY.total_seconds()


def test_a_certificate_for_another_key_is_not_taken(tmp_path: Path) -> None:
    ca = SidecarCa(write_ca(tmp_path / "ca"))
    tls = OperatorIssued("http://operator.invalid", lambda: None)
    _other_key, other_csr = key_and_csr()
    with pytest.raises(ValueError, match="not for this sidecar's key"):
        tls.install(ca.issue(other_csr, "ml", "w-0"))
    assert tls.issued is None
