"""A tiny HTTP client for torch's worker server, which listens on a unix socket.

Standard library only: the demo must not need aiohttp's event loop to ask four local ranks two
questions. Every request has a timeout, because the rank on the other end may be wedged.
"""

from __future__ import annotations

import http.client
import socket
from pathlib import Path


class WorkerServerError(Exception):
    """The rank's socket did not answer, or answered with something other than 200."""


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: Path, timeout: float) -> None:
        # The host only fills the Host header; the connection goes to the socket file.
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._socket_path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


def call_handler(socket_path: Path, handler: str, timeout: float, method: str = "POST") -> bytes:
    """Call `/handler/<handler>` on a worker server and return the body of a 200 answer."""
    conn = _UnixHTTPConnection(socket_path, timeout)
    try:
        conn.request(method, f"/handler/{handler}", body=b"" if method == "POST" else None)
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise WorkerServerError(f"{socket_path}: {handler}: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    if response.status != 200:
        text = body[:200].decode("utf-8", "replace")
        raise WorkerServerError(f"{socket_path}: {handler}: HTTP {response.status}: {text}")
    return body
