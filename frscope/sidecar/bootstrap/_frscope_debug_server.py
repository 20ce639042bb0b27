"""frscope bootstrap: a rank that runs torch's own debug server is read through it (sitecustomize.py calls in
here; this file sits beside it on the trainer's PYTHONPATH).

`torch.distributed.debug.start_debug_server()` (torch 2.13 to 2.15) starts a `_WorkerServer` on a TCP port in
every rank (ephemeral unless `worker_port` says otherwise), which answers the same process-wide handlers as
the bootstrap's unix socket. Once it runs in a rank:
- `<socket dir>/rank-<rank>.debug-server` says `{"port": N, "pid": P}` (0644, renamed into place), and the
  sidecar reads the rank at 127.0.0.1:N;
- the bootstrap's own socket is withdrawn (unlinked after that file exists, so the sidecar never sees the
  rank vanish); its server is left idle, not shut down (sitecustomize's _keep_forever says why). A rank whose
  debug server runs before the bootstrap would start its own server never starts one.
`stop_debug_server()` gives the rank back to the bootstrap's own socket (a new server, then the file goes).

`start_debug_server` and `stop_debug_server` are wrapped in the module (the originals are `__wrapped__`), at
its import or at once if it is already imported. `host` is the sitecustomize module: its lock, its server
and its helpers. Standard library only, like sitecustomize.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
from types import ModuleType
from typing import Any

TARGET = "torch.distributed.debug"
PORT = 0  # the port of torch's debug server that this process pointed the sidecar at (0: none)
FILE = ""  # the rank-<r>.debug-server file this process wrote


def running_port() -> int:
    """The port of torch's debug server in this process (`torch.distributed.debug._WORKER_SERVER`), or 0."""
    module = sys.modules.get(TARGET)
    server = getattr(module, "_WORKER_SERVER", None) if module is not None else None
    try:
        port = int(getattr(server, "port", 0) or 0)
    except Exception:
        return 0
    return port if 0 < port < 65536 else 0


def file_for(socket_dir: str, rank: int) -> str:
    return os.path.join(socket_dir, f"rank-{rank}.debug-server")


def point(host: Any, rank: int, port: int) -> None:
    """Point the sidecar at torch's debug server of this rank; frscope's handlers are served there too.
    The caller holds host._LOCK."""
    global PORT, FILE
    socket_dir = host._socket_dir()
    target = file_for(socket_dir, rank)
    host._register_handlers()
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as handle:
            json.dump({"port": port, "pid": os.getpid()}, handle)
        os.chmod(tmp, 0o644)  # read by the sidecar's own user
        os.replace(tmp, target)
    except OSError as exc:
        host._say(f"cannot point the sidecar at torch's debug server ({target}: {exc}); frscope's own server stays")
        return
    PORT, FILE = port, target
    host._SERVER_RANK = rank
    if not host._SERVER_PID:
        host._SERVER_PID = os.getpid()
    atexit.register(_remove, target)
    os.environ[host._OWNER_VAR] = str(os.getpid())  # children of this rank never serve
    host._write_meta(socket_dir, rank, "", debug_server_port=port)
    if host._SERVER is not None and host._SERVER_PATH and os.getpid() == host._SERVER_PID:
        try:  # only now (the file above exists): the sidecar reads the rank there, never sees it gone
            os.unlink(host._SERVER_PATH)
        except OSError:
            pass
        host._say(f"torch's debug server serves rank {rank} on port {port}: the sidecar reads it there; frscope's "
                  f"own socket {host._SERVER_PATH} withdrawn")
    else:
        host._say(f"torch's debug server serves rank {rank} on port {port}: the sidecar reads it there")


def remove_stale(socket_dir: str, rank: int, alive: Any) -> None:
    """Before the bootstrap serves the rank's socket: a file an earlier process of the rank left (a restarted
    worker that died without its clean exit) would point the sidecar at a dead port."""
    path = file_for(socket_dir, rank)
    try:
        with open(path, "rb") as handle:
            pid = json.loads(handle.read(4096)).get("pid")
    except (OSError, ValueError, AttributeError):
        pid = None
    if isinstance(pid, int) and pid != os.getpid() and alive(pid):
        return
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove(path: str) -> None:
    """At a clean exit: the sidecar sees the trainer is gone (as the socket's removal does)."""
    if path != FILE:
        return  # a forked child's exit, or a file given back at stop_debug_server
    try:
        with open(path, "rb") as handle:
            if json.loads(handle.read(4096)).get("pid") != os.getpid():
                return
        os.unlink(path)
    except (OSError, ValueError, AttributeError):
        pass


def close_inherited_listener() -> None:
    """In a forked child of a rank that runs torch's debug server: close the child's copy of that server's
    listening socket (as sitecustomize does for its own), which would outlive a crashed rank."""
    if not PORT:
        return
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        return
    for fd in fds:
        try:
            sock = socket.socket(fileno=fd)
        except Exception:
            continue
        try:
            ours = (sock.family in (socket.AF_INET, socket.AF_INET6) and sock.getsockname()[1] == PORT
                    and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1)
        except Exception:
            ours = False
        if ours:
            sock.close()
            return
        sock.detach()


def _this_rank(host: Any) -> int | None:
    """The rank this process is: the one it serves as, torchrun's, its default group's, else RANK (which
    torch's debug server keys itself by)."""
    if host._SERVER_RANK is not None:
        return int(host._SERVER_RANK)
    rank = host._elastic_rank()
    if rank is not None:
        return int(rank)
    if host._has_group():
        try:
            return int(sys.modules[host._TARGET].get_rank())
        except Exception:
            pass
    text = os.environ.get("RANK", "")
    return int(text) if text.isdigit() else None


def _started(host: Any) -> None:
    """After the job's start_debug_server() (also when it raised after its worker server started, as rank 0's
    does where the frontend's imports are missing)."""
    if host._inherited() or PORT:
        return
    port = running_port()
    rank = _this_rank(host)
    if not port or rank is None:
        return
    with host._LOCK:
        point(host, rank, port)


def _stopped(host: Any) -> None:
    """After the job's stop_debug_server(): the bootstrap's own socket serves the rank again."""
    global PORT, FILE
    rank, path = host._SERVER_RANK, FILE
    if not PORT or rank is None or running_port():
        return
    PORT, FILE = 0, ""
    with host._LOCK:
        host._SERVER = None  # the withdrawn one stays referenced forever (host._keep_forever): never freed
    host._start_server(int(rank))  # (removes the file, which names this process, right before it serves)
    try:
        os.unlink(path)
    except OSError:
        pass


def _wrap(host: Any, module: ModuleType) -> None:
    for name, after in (("start_debug_server", _started), ("stop_debug_server", _stopped)):
        real = getattr(module, name, None)
        if real is None or getattr(real, "_frscope_wrapped", False):
            continue
        setattr(module, name, _wrapper(host, real, after))


def _wrapper(host: Any, real: Any, after: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return real(*args, **kwargs)
        finally:
            try:
                after(host)
            except Exception as exc:
                host._say(f"torch's debug server: {type(exc).__name__}: {exc}")

    wrapped.__name__ = getattr(real, "__name__", "wrapped")
    wrapped.__qualname__ = getattr(real, "__qualname__", wrapped.__name__)
    wrapped.__doc__ = real.__doc__
    wrapped.__wrapped__ = real  # type: ignore[attr-defined]
    wrapped._frscope_wrapped = True  # type: ignore[attr-defined]
    return wrapped


def watch(host: Any) -> None:
    """Wrap the module's start/stop_debug_server now, or when it is imported."""
    module = sys.modules.get(TARGET)
    if module is not None:
        _wrap(host, module)
    else:
        sys.meta_path.insert(0, host._Finder(TARGET, lambda loaded: _wrap(host, loaded)))
