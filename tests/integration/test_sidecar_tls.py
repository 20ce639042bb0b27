"""TLS between the operator's sidecar client and a real `frscope sidecar` process (docs/install.md, "TLS to
the sidecars"): the operator reads a sidecar over HTTPS when the sidecar's certificate comes from the
operator's CA and names the pod asked for, and refuses one that names another pod, one signed by another
CA, and a sidecar still serving its placeholder certificate. (The issuing over the real API server's
TokenReview: tests/e2e/test_sidecar_tls_e2e.py.)"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from frscope.operator.evidence.sidecar_tls import SidecarCa
from frscope.operator.evidence.sidecars import SidecarClient, SidecarError
from frscope.testing.tls import key_and_csr, write_ca

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "team-a"
POD = "train-worker-0"


def _sidecar(tmp_path: Path, *tls_args: str) -> Iterator[str]:
    port_file = tmp_path / "port"
    log = open(tmp_path / "sidecar.log", "wb")  # closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(tmp_path), "--evidence-dir", "none",
         "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), "--pod", POD,
         "--namespace", NAMESPACE, *tls_args],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, (tmp_path / "sidecar.log").read_text(errors="replace")
            assert time.monotonic() < deadline, "the sidecar did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{int(port_file.read_text())}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _issued(ca: SidecarCa, tmp_path: Path, namespace: str, pod: str) -> tuple[Path, Path]:
    key_pem, csr = key_and_csr()
    (tmp_path / "tls.key").write_bytes(key_pem)
    (tmp_path / "tls.crt").write_bytes(ca.issue(csr, namespace, pod))
    return tmp_path / "tls.crt", tmp_path / "tls.key"


@pytest.fixture
def ca(tmp_path: Path) -> SidecarCa:
    return SidecarCa(write_ca(tmp_path / "ca"))


@pytest.fixture
def own_sidecar(ca: SidecarCa, tmp_path: Path) -> Iterator[str]:
    """A real sidecar serving the certificate the operator's CA issued for team-a/train-worker-0."""
    cert, key = _issued(ca, tmp_path, NAMESPACE, POD)
    yield from _sidecar(tmp_path, "--tls-cert-file", str(cert), "--tls-key-file", str(key))


@pytest.mark.timeout(90)
async def test_the_operator_reads_its_pods_sidecar_over_https(ca: SidecarCa, own_sidecar: str) -> None:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        client = SidecarClient(session, tls=ca)
        status = await client.status(own_sidecar, 10, pod=(NAMESPACE, POD))
        assert (status.namespace, status.pod) == (NAMESPACE, POD)
        body = await client.snapshot_bytes(own_sidecar, 10, refresh=False, pod=(NAMESPACE, POD))
        assert body  # the snapshot travelled over the same TLS connection pool
        # Plain HTTP to the same port gets no answer: the port serves TLS only.
        with pytest.raises(SidecarError):
            await SidecarClient(session).status(own_sidecar, 5, pod=(NAMESPACE, POD))


@pytest.mark.timeout(90)
async def test_a_certificate_for_another_pod_is_refused(ca: SidecarCa, own_sidecar: str) -> None:
    """The sidecar at this address holds a real certificate of the CA, but for train-worker-0: asked as
    train-worker-1 (an address the operator believes is that pod's), the operator refuses to talk."""
    async with aiohttp.ClientSession() as session:
        client = SidecarClient(session, tls=ca)
        with pytest.raises(SidecarError, match="TLS: the sidecar's certificate is refused.*[Hh]ostname mismatch"):
            await client.status(own_sidecar, 10, pod=(NAMESPACE, "train-worker-1"))
        with pytest.raises(SidecarError, match="TLS: the sidecar's certificate is refused"):
            await client.status(own_sidecar, 10, pod=("team-b", POD))  # same pod name, another namespace


@pytest.mark.timeout(90)
async def test_a_certificate_of_another_ca_is_refused(ca: SidecarCa, tmp_path: Path) -> None:
    """A sidecar whose certificate names the right pod but comes from another CA (one a tenant made)."""
    other = SidecarCa(write_ca(tmp_path / "other-ca", name="frscope-sidecar-ca"))
    cert, key = _issued(other, tmp_path, NAMESPACE, POD)
    for endpoint in _sidecar(tmp_path, "--tls-cert-file", str(cert), "--tls-key-file", str(key)):
        async with aiohttp.ClientSession() as session:
            with pytest.raises(SidecarError, match="TLS: the sidecar's certificate is refused.*certificate verify"):
                await SidecarClient(session, tls=ca).status(endpoint, 10, pod=(NAMESPACE, POD))
            # The same sidecar is read by a client of its own CA: only trust differs.
            assert (await SidecarClient(session, tls=other).status(endpoint, 10, pod=(NAMESPACE, POD))).pod == POD
