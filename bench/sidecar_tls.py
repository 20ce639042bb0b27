#!/usr/bin/env python3
"""What TLS to the sidecars costs the operator (docs/install.md, "TLS to the sidecars").

Measured, on this machine:
- issuing: `SidecarCa.issue` per sidecar certificate (a CSR checked, a certificate signed), the work of one
  `POST /v1/certificate` besides its token review and pod read; with the chart's CA (RSA 2048, helm's
  genCA) and a P-256 one;
- a status sweep: N sidecar sites (each with its own pod's certificate, in a child process) read once by
  the operator's client (`SidecarClient._get_bytes`' TLS settings: the CA alone, the pod's name expected),
  new connections each (keep-alive gone between sweeps, the worst case) and reused ones, HTTPS vs plain
  HTTP; the operator process's CPU time per request and the sweep's wall time.

    .venv/bin/python bench/sidecar_tls.py --pods 512             # prints a table, appends it to RESULTS.md
    .venv/bin/python bench/sidecar_tls.py --pods 64 --no-results
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "RESULTS.md"
SECTION = "## TLS to the sidecars"
STATUS_BYTES = 4096  # a status answer of a few ranks


def _rsa_ca(directory: Path) -> Path:
    """A CA like helm's genCA makes (RSA 2048)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "frs-frscope-sidecar-ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    return directory


def _issue_ms(ca_dir: Path, count: int) -> float:
    from frscope.operator.evidence.sidecar_tls import SidecarCa
    from frscope.testing.tls import key_and_csr

    ca = SidecarCa(ca_dir)
    csrs = [key_and_csr()[1] for _ in range(count)]
    started = time.perf_counter()
    for i, csr in enumerate(csrs):
        ca.issue(csr, "ml", f"train-worker-{i}")
    return (time.perf_counter() - started) * 1000 / count


def _farm(ca_dir: str, pods: int, tls: bool, ports: Any, ready: Any) -> None:
    from aiohttp import web

    from frscope.operator.evidence.sidecar_tls import SidecarCa
    from frscope.testing.tls import key_and_csr

    async def main() -> None:
        ca = SidecarCa(Path(ca_dir))
        body = b'{"x": "' + b"0" * (STATUS_BYTES - 10) + b'"}'

        async def status(_: web.Request) -> web.Response:
            return web.Response(body=body, content_type="application/json")

        app = web.Application()
        app.router.add_get("/v1/status", status)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        work = Path(tempfile.mkdtemp())
        for i in range(pods):
            context = None
            if tls:
                key, csr = key_and_csr()
                (work / "k").write_bytes(key)
                (work / "c").write_bytes(ca.issue(csr, "ml", f"train-worker-{i}"))
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(str(work / "c"), str(work / "k"))
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
            await site.start()
            ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _sweep(ca_dir: Path, ports: list[int], tls: bool, reuse: bool) -> tuple[float, float, float]:
    """One read of every site, as the operator's client does it; (wall s, this process's CPU ms/request,
    KiB of memory per open connection, with `reuse`)."""
    import aiohttp

    from frscope.operator.evidence.sidecar_tls import SidecarCa, server_name

    ca = SidecarCa(ca_dir)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=4, force_close=not reuse)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        async def one(i: int, port: int) -> None:
            extra: dict[str, Any] = {}
            if tls:
                extra = {"ssl": ca.client_context(), "server_hostname": server_name("ml", f"train-worker-{i}")}
            url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1/status"
            async with session.get(url, **extra) as resp:
                assert resp.status == 200
                await resp.read()

        semaphore = asyncio.Semaphore(64)  # the operator's --poll-concurrency

        async def bounded(i: int, port: int) -> None:
            async with semaphore:
                await one(i, port)

        await asyncio.gather(*(bounded(i, p) for i, p in enumerate(ports[:8])))  # imports, contexts: not counted
        rss = _rss_kib()
        if reuse:  # warm the pool: the sweep measured below finds its connections open
            await asyncio.gather(*(bounded(i, p) for i, p in enumerate(ports)))
        held_kib = (_rss_kib() - rss) / len(ports) if reuse else 0.0
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(bounded(i, p) for i, p in enumerate(ports)))
        return time.perf_counter() - wall, (time.process_time() - cpu) * 1000 / len(ports), held_kib


def run(pods: int) -> dict[str, Any]:
    from frscope.testing.tls import write_ca

    work = Path(tempfile.mkdtemp())
    out: dict[str, Any] = {"pods": pods}
    out["issue_ms_rsa"] = _issue_ms(_rsa_ca(work / "rsa"), 200)
    out["issue_ms_p256"] = _issue_ms(write_ca(work / "p256"), 200)
    ca_dir = work / "p256"
    ctx = multiprocessing.get_context("spawn")
    for tls in (False, True):
        manager = ctx.Manager()
        ports, ready = manager.list(), manager.Event()
        farm = ctx.Process(target=_farm, args=(str(ca_dir), pods, tls, ports, ready), daemon=True)
        farm.start()
        try:
            assert ready.wait(600), "the farm did not start"
            for reuse in (False, True):
                out[("https" if tls else "http", "reused" if reuse else "new")] = asyncio.run(
                    _sweep(ca_dir, list(ports), tls, reuse))
        finally:
            farm.terminate()
            farm.join(10)
            manager.shutdown()
    return out


def table(r: dict[str, Any]) -> str:
    lines = [f"{r['pods']} sidecar sites on loopback, one read each (`--poll-concurrency` 64); the operator "
             "process's CPU per request and the sweep's wall time:", "",
             "| scheme | connections | sweep wall | operator CPU per request | memory per open connection |",
             "|---|---|---:|---:|---:|"]
    for scheme in ("http", "https"):
        for conn in ("new", "reused"):
            wall, cpu, held = r[(scheme, conn)]
            memory = f"{held:.0f} KiB" if conn == "reused" else "-"
            lines.append(f"| {scheme} | {conn} | {wall:.2f} s | {cpu:.2f} ms | {memory} |")
    lines += ["", "The operator closes each TLS connection after its request (the `new` row is what it pays): asyncio "
              "holds a 256 KiB buffer per open TLS connection, which idle keep-alive connections to 1,000s of "
              "sidecars would hold.",
              "", f"Issuing one sidecar certificate (`SidecarCa.issue`): {r['issue_ms_rsa']:.2f} ms with an RSA "
              f"2048 CA (the chart's genCA), {r['issue_ms_p256']:.2f} ms with a P-256 CA (cert-manager's)."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=512)
    parser.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    args = parser.parse_args()
    result = run(args.pods)
    text = table(result)
    print(text)
    if not args.no_results:
        stamp = time.strftime("%Y-%m-%d")
        block = (f"\n{SECTION} ({stamp}, {platform.machine()}, {os.cpu_count()} CPUs, Python "
                 f"{platform.python_version()})\n\n`.venv/bin/python bench/sidecar_tls.py --pods {args.pods}`\n\n"
                 f"{text}\n")
        with RESULTS.open("a") as f:
            f.write(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
