"""Where the sidecar reads each rank: its socket, or the port of torch's debug server that the bootstrap's
`rank-<r>.debug-server` names. That file is written by the trainer: whatever it holds, the sidecar reads
nothing but a port on the pod's loopback, and a file that is not one is ignored (the rank's socket, if any,
serves). The real job: tests/integration/test_torch_debug_server.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from frscope.sidecar.client import DebugServerPort, WorkerClient, source_of
from frscope.sidecar.ranks import DEBUG_SERVER_FILE_MAX_BYTES, read_debug_server_port, scan_ranks

pytestmark = pytest.mark.timeout(30)


def _listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


def test_the_debug_server_file_wins_over_the_socket_of_the_same_rank(tmp_path: Path) -> None:
    sockets = [_listen(tmp_path / f"rank-{r}.sock") for r in (0, 1)]
    try:
        (tmp_path / "rank-1.debug-server").write_text('{"port": 41234, "pid": 77}')
        (tmp_path / "rank-2.debug-server").write_text('{"port": 41235, "pid": 78}')  # no socket at all
        found = scan_ranks(tmp_path)
    finally:
        for sock in sockets:
            sock.close()
    assert found == {0: tmp_path / "rank-0.sock", 1: DebugServerPort(41234), 2: DebugServerPort(41235)}
    assert source_of(DebugServerPort(41234)) == "torch-debug-server:127.0.0.1:41234"
    assert WorkerClient(DebugServerPort(41234), timeout_s=1, max_bytes=1).base_url == "http://127.0.0.1:41234"


@pytest.mark.parametrize("content", [
    b"", b"not json", b"[41234]", b'{"port": "41234"}', b'{"port": true}', b'{"port": 0}', b'{"port": 65536}',
    b'{"port": -1}', b'{"port": 41234.0}', b'{"host": "10.0.0.9", "port": null}',
    b'{"port": 41234, "pad": "' + b"x" * DEBUG_SERVER_FILE_MAX_BYTES + b'"}',
    b"[" * 4000,  # nested past the JSON decoder's recursion limit, within the size cap
], ids=["empty", "text", "list", "string", "bool", "zero", "too-high", "negative", "float", "no-port", "too-long",
        "deep"])
def test_a_file_that_is_not_a_port_is_ignored_and_the_socket_serves(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "rank-0.debug-server").write_bytes(content)
    sock = _listen(tmp_path / "rank-0.sock")
    try:
        assert read_debug_server_port(tmp_path / "rank-0.debug-server") is None
        assert scan_ranks(tmp_path) == {0: tmp_path / "rank-0.sock"}
    finally:
        sock.close()


def test_a_host_in_the_file_is_never_used(tmp_path: Path) -> None:
    (tmp_path / "rank-0.debug-server").write_text('{"port": 41234, "host": "10.0.0.9", "url": "http://evil/"}')
    (endpoint,) = scan_ranks(tmp_path).values()  # type: ignore[union-attr]
    assert endpoint == DebugServerPort(41234)
    assert WorkerClient(endpoint, timeout_s=1, max_bytes=1).base_url == "http://127.0.0.1:41234"
