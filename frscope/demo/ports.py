"""A port for a local job's rendezvous (torch's TCP store, bound by rank 0 when it starts).

Binding port 0 hands out a port from the kernel's ephemeral range, the range every outgoing connection
on the machine takes its local port from: between choosing it and rank 0 binding it, a busy machine's
connections can take it (EADDRINUSE, seen in CI). A port just below that range is never handed out to
a connection; it is checked free by binding it, and taken at random so that jobs started side by side
do not pick the same one.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768
SPAN = 8192  # ports below the ephemeral range to draw from


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def rendezvous_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host`, outside the ephemeral range where it can be (else any free port)."""
    high = _ephemeral_low() - 1
    low = max(1024, high - SPAN)
    for _ in range(64) if high > low else ():
        port = random.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
