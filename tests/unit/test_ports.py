"""The rendezvous port of a local job: free, and outside the kernel's ephemeral range (which binding
port 0 and every outgoing connection draw from), so no other process's connection can take it first."""

from __future__ import annotations

import socket

from frscope.demo import ports


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    low = ports._ephemeral_low()
    for _ in range(20):
        port = ports.rendezvous_port()
        assert 1024 <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free: rank 0 can bind it


def test_a_taken_port_is_never_handed_out(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With the range narrowed to one port that is taken, the fallback is any free port, not that one."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    taken = held.getsockname()[1]
    try:
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: taken + 1)
        monkeypatch.setattr(ports, "SPAN", 1)
        assert ports.rendezvous_port() != taken
    finally:
        held.close()
