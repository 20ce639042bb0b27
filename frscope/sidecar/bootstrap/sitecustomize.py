"""frscope bootstrap: serve torch's worker server on `<FRSCOPE_SOCKET_DIR>/rank-<rank>.sock` in every
training process, with no change to the training code.

Put this file's directory on the trainer's PYTHONPATH (`frscope sidecar print-pythonpath`, or the
volume that `frscope sidecar --install-bootstrap DIR` fills). Python imports `sitecustomize` at
startup; this one installs a meta-path finder for `torch.distributed` whose loader first runs the
real module and then decides whether this process is a rank (starting the server while
torch.distributed is still importing fails: `cannot import name '_WorkerServer'`). Nothing happens
in a process that never imports torch.distributed or whose socket dir does not exist.

Which process is a rank is decided from what only ranks have, never from RANK alone (a PyTorchJob
puts RANK = the pod's index on the container, so torchrun's agent has it too):
- a worker that torchrun's elastic agent started: the agent gives its workers, and only them,
  TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT and LOCAL_RANK (torch/distributed/elastic/agent/
  server/local_elastic_agent.py, `_start_workers`). The server starts at once, as rank RANK, so a
  rank stuck in rendezvous already answers `dump_traceback`;
- any other process (plain `python` per rank, torch.multiprocessing.spawn, launchers of one's own):
  a daemon thread waits until the default process group exists and serves as
  `torch.distributed.get_rank()`. torchrun's agent never makes a process group, so it never serves.
A process that inherited FRSCOPE_WORKER_SERVER_PID of another process (a spawned DataLoader worker)
and a forked child of a serving process (a forked DataLoader worker) never serve; a forked child closes
its copy of the server's listening socket, which would outlive a crashed rank. A socket file is taken
over only when no live process listens on it.

In a worker of torchrun's agent, an uncaught exception is also written to the error file the agent
names (TORCHELASTIC_ERROR_FILE), as torch's own `@record` does, unless something wrote it already. The
agent then prints the exception in its failure summary, the end of the container's log: the part that
Kubernetes keeps as the termination message (its last 2 KiB). Without it the summary says only "To
enable traceback see ...", and the rank's own error has scrolled out of those 2 KiB.

Each rank also dates its own collectives (start, end) on every backend, served as
`frscope_timings` (`_frscope_timings.py`, beside this file): the durations gloo's recorder lacks.

A rank that runs torch's own debug server (`torch.distributed.debug.start_debug_server()`: a `_WorkerServer`
on a TCP port, the same process-wide handlers) is read there instead: `_frscope_debug_server.py`, beside
this file, points the sidecar at it (`rank-<rank>.debug-server`) and withdraws this bootstrap's socket, or
never starts one.

Environment: FRSCOPE_SOCKET_DIR (default /run/frscope), FRSCOPE_BOOTSTRAP=0 to switch it off,
FRSCOPE_TIMINGS=0 to leave collectives undated, FRSCOPE_TIMINGS_SIZE (the ring, default 2000). The
recorder's settings (TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE, TORCH_FR_DUMP_ON_TIMEOUT, each else
its old TORCH_NCCL_* name, as torch reads them) go into `.rank-<r>.json`; a buffer of 0 (the recorder off)
is said. Any other `sitecustomize` that this file shadows on sys.path (Debian's, a venv's) is still run. The
bootstrap never raises into the training process; a failure, or a torch without the worker server,
is one line on stderr and no live collection.

Standard library only (plus torch, once the training code imports it). Keep it that way: this file
runs inside the user's training image, where frscope is not installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import socket
import struct
import sys
import threading
import time
from types import ModuleType
from typing import Any

_TARGET = "torch.distributed"
_SERVER: Any = None  # kept referenced for the life of the process: torch stops the server on collection
_SERVER_PID = 0  # the process that started _SERVER (a forked child inherits the variable, not the server)
_SERVER_PATH = ""  # the socket _SERVER listens on
_SERVER_RANK: int | None = None  # the rank this process serves as (its own server, or torch's debug server)
_HANDLERS_REGISTERED = False
_LOCK = threading.Lock()
_OWNER_VAR = "FRSCOPE_WORKER_SERVER_PID"
# Set by torchrun's elastic agent in the environment of each worker it starts, never in its own.
_ELASTIC_WORKER_VARS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "LOCAL_RANK", "RANK")
_WAIT_MAX_S = 1.0  # the waiting thread's longest sleep between looks for a process group
_KEPT: list[Any] = []  # where _keep_forever keeps what it cannot leak through ctypes


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"[frscope bootstrap] {message}\n")
    except Exception:
        pass


def _socket_dir() -> str:
    return os.environ.get("FRSCOPE_SOCKET_DIR", "/run/frscope")


def _inherited() -> bool:
    """True in a child of a serving process (it inherited the server's pid in the environment)."""
    owner = os.environ.get(_OWNER_VAR)
    return bool(owner) and owner != str(os.getpid())


def _elastic_rank() -> int | None:
    """RANK of a worker that torchrun's agent started, or None for any other process."""
    env = os.environ
    if not all(env.get(name) for name in _ELASTIC_WORKER_VARS):
        return None
    rank = env["RANK"]
    return int(rank) if rank.isdigit() and env["LOCAL_RANK"].isdigit() else None


def _stale(path: str) -> bool:
    """A socket file that no live process serves: nobody listens on it (left by an earlier process: a
    restarted worker or container), or the process that listens is gone and only something that inherited
    the socket keeps it open (a forked child of a crashed rank that is not a Python child of ours)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return True
    finally:
        probe.close()
    listener = struct.unpack("3i", creds)[0]  # the pid that called listen(); 0 if not visible from here
    return listener > 0 and not _alive(listener)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return not os.path.isdir("/proc/self")  # no /proc to ask: assume alive
    return state not in (b"Z", b"X")  # a zombie does not serve


def _start_server(rank: int) -> None:
    global _SERVER, _SERVER_PID, _SERVER_PATH, _SERVER_RANK
    with _LOCK:
        if _SERVER is not None or _debug_port() or _inherited():
            return
        socket_dir = _socket_dir()
        path = os.path.join(socket_dir, f"rank-{rank}.sock")
        debug: Any = sys.modules.get("_frscope_debug_server")
        port = debug.running_port() if debug is not None else 0
        if port:  # torch's debug server runs here already: the sidecar reads that one
            debug.point(sys.modules[__name__], rank, port)
            return
        try:
            from torch._C import _distributed_c10d as c10d

            server_type = getattr(c10d, "_WorkerServer", None)
            if server_type is None:
                torch = sys.modules.get("torch")
                _say(f"no live collection: torch {getattr(torch, '__version__', '?')} has no worker server "
                     "(torch._C._distributed_c10d._WorkerServer)")
                return
            if os.path.exists(path):
                if not _stale(path):
                    _say(f"{path} is already served by another process; not starting a second server")
                    return
                os.unlink(path)
            if debug is not None:
                debug.remove_stale(socket_dir, rank, _alive)
            _register_handlers()
            import atexit

            # Registered before the socket exists: a short program may be exiting while this runs.
            _SERVER_PID = os.getpid()
            atexit.register(_remove_socket, path)
            _SERVER = server_type(path)
            _SERVER_PATH = path
            _SERVER_RANK = rank
            # The sidecar runs as its own user (the chart's 65532), the trainer often as root: connecting to
            # a unix socket needs write permission on it. The directory is the pod's own shared volume.
            os.chmod(path, 0o666)
            _keep_forever(_SERVER)
            os.environ[_OWNER_VAR] = str(_SERVER_PID)
            _write_meta(socket_dir, rank, path)
        except Exception as exc:
            _SERVER_PID = 0
            _say(f"no live collection: could not start torch's worker server on {path}: {type(exc).__name__}: {exc}")


def _debug_server() -> Any:
    """`_frscope_debug_server` (beside this file): a rank that runs torch's own debug server is read through
    it. None where it is missing (an older copy of the bootstrap)."""
    try:
        import _frscope_debug_server  # type: ignore[import-not-found]  # beside this file on sys.path

        return _frscope_debug_server
    except Exception as exc:
        _say(f"torch's debug server will not be read ({type(exc).__name__}: {exc})")
        return None


def _debug_port() -> int:
    """The port of torch's debug server the sidecar reads this rank at (0: none)."""
    module = sys.modules.get("_frscope_debug_server")
    return int(getattr(module, "PORT", 0) or 0)


def _wait_for_group() -> None:
    """Serve as soon as this process has a default process group (it is a rank then), however late."""
    delay = 0.05
    while _SERVER is None and not _debug_port() and not _inherited():
        try:
            dist = sys.modules[_TARGET]
            if dist.is_available() and dist.is_initialized():
                _start_server(int(dist.get_rank()))
                return
        except Exception as exc:
            _say(f"no live collection: {type(exc).__name__}: {exc}")
            return
        time.sleep(delay)
        delay = min(delay * 2, _WAIT_MAX_S)


def _watch() -> None:
    threading.Thread(target=_wait_for_group, name="frscope-bootstrap", daemon=True).start()


def _has_group() -> bool:
    dist = sys.modules.get(_TARGET)
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:
        return False


def _after_fork_in_child() -> None:
    """A forked child has no server and no waiting thread, but a copy of its parent's process group.
    The child of a rank (a forked DataLoader worker: the parent serves, or has a group and is about to)
    never serves, nor do its children; any other child (ranks forked by a launcher before they join a
    group) waits for a group of its own."""
    global _LOCK
    _LOCK = threading.Lock()  # the parent's lock may have been held by a thread that is gone
    if _SERVER is not None:
        _close_inherited_listener(_SERVER_PATH)
    debug = sys.modules.get("_frscope_debug_server")
    if debug is not None:
        debug.close_inherited_listener()
    if _SERVER is not None or _debug_port() or _inherited() or _has_group():
        os.environ.setdefault(_OWNER_VAR, str(os.getppid()))
        return
    _watch()


def _close_inherited_listener(path: str) -> None:
    """A forked child holds a copy of its parent's listening socket. Were the parent to die first (a
    crashed rank, its DataLoader workers still up for a few seconds), the socket would go on taking
    connections that nobody answers: the sidecar would wait on a dead rank, and a restarted rank would
    take the socket for served. The child never uses it (fork copies only the forking thread)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        return
    for fd in fds:
        try:
            sock = socket.socket(fileno=fd)
        except Exception:
            continue  # not a socket (or gone: listdir's own descriptor)
        try:
            ours = (sock.family == socket.AF_UNIX and sock.getsockname() == path
                    and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1)
        except Exception:
            ours = False
        if ours:
            sock.close()
            return
        sock.detach()


def _record_uncaught_for_torchrun() -> None:
    """Chain a sys.excepthook that writes the exception to TORCHELASTIC_ERROR_FILE (torch's `@record`
    format) in this process only, when the file is not there yet; the previous hook then runs as ever."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    if not path:
        return
    previous = sys.excepthook
    me = os.getpid()

    def hook(exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if os.getpid() == me and not os.path.exists(path):
                import traceback

                data = {"message": {"message": f"{exc_type.__name__}: {exc}", "extraInfo": {
                    "py_callstack": "".join(traceback.format_exception(exc_type, exc, tb)),
                    "timestamp": str(int(time.time()))}}}
                tmp = f"{path}.{me}.tmp"
                with open(tmp, "w") as handle:
                    json.dump(data, handle)
                os.replace(tmp, path)
        except Exception:
            pass
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def _on_loaded() -> None:
    """torch.distributed has finished importing: decide whether this process serves."""
    if _inherited():
        return  # a spawned child of a serving rank
    debug = _debug_server()
    if debug is not None:
        debug.watch(sys.modules[__name__])
    _install_timings()
    rank = _elastic_rank()
    if rank is not None:
        _record_uncaught_for_torchrun()
        _start_server(rank)
    else:
        _watch()
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _progress(request: Any, response: Any) -> None:
    """`POST /handler/frscope_progress`: the recorders' pg_status (last enqueued / started / completed
    collective per group) without their entries, for the sidecar's cheap poll. Microseconds, where
    fr_trace_json serializes the whole ring (tens of ms of this process's CPU)."""
    try:
        from torch._C import _distributed_c10d as c10d

        recorders = {}
        for name, dump in (("fr", "_dump_fr_trace_json"), ("nccl", "_dump_nccl_trace_json")):
            fn = getattr(c10d, dump, None)
            if fn is None:
                continue
            try:
                raw = fn(includeCollectives=False, onlyActive=True)
            except Exception:
                continue
            status = json.loads(raw).get("pg_status") or {}
            if status or name == "fr":
                recorders[name] = {"pg_status": status}
        response.set_content(json.dumps({"frscope_progress": 1, "recorders": recorders}), "application/json")
        response.set_status(200)
    except Exception as exc:
        response.set_content(f"frscope_progress: {type(exc).__name__}: {exc}", "text/plain")
        response.set_status(500)


def _timings_module() -> Any:
    """This bootstrap's `_frscope_timings` (beside this file), or None where it is off or missing."""
    if os.environ.get("FRSCOPE_TIMINGS", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        import _frscope_timings  # type: ignore[import-not-found]  # beside this file on sys.path

        return _frscope_timings
    except Exception as exc:
        _say(f"no collective durations: {type(exc).__name__}: {exc}")
        return None


def _install_timings() -> None:
    timings = _timings_module()
    if timings is not None:
        timings.install(_say)


def _register_handlers() -> None:
    """frscope's handlers, once per process: every worker server of the process serves them (ours, or torch's
    debug server's)."""
    global _HANDLERS_REGISTERED
    if _HANDLERS_REGISTERED:
        return
    _HANDLERS_REGISTERED = True
    _register_progress_handler()
    _register_timings_handler()


def _register_timings_handler() -> None:
    timings = _timings_module()
    if timings is None or not timings.TIMINGS.mechanism:
        return
    try:
        from torch._C._distributed_c10d import _register_handler

        _keep_forever(timings.handler)
        _register_handler("frscope_timings", timings.handler)
    except Exception as exc:
        _say(f"no frscope_timings handler ({type(exc).__name__}: {exc})")


def _register_progress_handler() -> None:
    try:
        from torch._C._distributed_c10d import _register_handler

        _keep_forever(_progress)
        _register_handler("frscope_progress", _progress)
    except Exception as exc:  # an older torch: the sidecar polls fr_trace_json every time
        _say(f"no frscope_progress handler ({type(exc).__name__}: {exc}); the sidecar polls full recorders")


# The recorder's settings as torch reads them: the TORCH_FR_* name, else its old TORCH_NCCL_* alias (torch
# >= 2.9 reads the names in this order, older torch the alias only), else torch's default.
_RECORDER_ENV = (
    ("buffer_size", ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), "2000"),
    ("dump_prefix", ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), ""),
    ("dump_on_timeout", ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT"), ""),
)


def _recorder_settings(env: Any = None) -> dict[str, Any]:
    """{setting: {"value": ..., "from": the variable it came from, or "default"}}."""
    env = os.environ if env is None else env
    settings: dict[str, Any] = {}
    for key, names, default in _RECORDER_ENV:
        name = next((n for n in names if env.get(n) is not None), None)
        settings[key] = {"value": env[name] if name else default, "from": name or "default"}
    return settings


def _recorder_off(settings: dict[str, Any]) -> bool:
    try:
        return int(str(settings["buffer_size"]["value"]).strip()) <= 0
    except ValueError:
        return False  # torch refuses it itself


def _write_meta(socket_dir: str, rank: int, path: str, debug_server_port: int = 0) -> None:
    torch = sys.modules.get("torch")
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    recorder = _recorder_settings()
    if _recorder_off(recorder):
        _say(f"{recorder['buffer_size']['from']}={recorder['buffer_size']['value']}: torch's Flight Recorder is "
             "off in this rank; frscope sees its stacks but no collectives")
    meta: dict[str, Any] = {
        "rank": rank,
        "pid": os.getpid(),
        "socket": path,
        "torch_version": str(getattr(torch, "__version__", "")),
        "hostname": socket.gethostname(),
        "started_at_ns": time.time_ns(),
        "recorder": recorder,
    }
    if debug_server_port:  # read through torch's debug server (path: "")
        meta["debug_server_port"] = debug_server_port
    if restarts.isdigit():  # torchrun restarted its workers this many times (--max-restarts)
        meta["restart_count"] = int(restarts)
    target = os.path.join(socket_dir, f".rank-{rank}.json")
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as handle:
            json.dump(meta, handle)
        # Read by the sidecar, which runs as its own user (65532): readable whatever the trainer's umask.
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError:
        pass


def _keep_forever(obj: Any) -> None:
    """Never free `obj`, not even at exit. The progress handler: torch's handler table is a C++ static
    that drops its reference after the interpreter is gone, and freeing the function then aborts the
    process (exit status 134, seen with torch 2.13). The server: its destructor calls shutdown(),
    which never returns when it comes right after the start (seen with torch 2.13) and holds the GIL
    while it waits for a handler that may be waiting for the GIL. The process's exit ends it anyway."""
    try:
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    except Exception:
        _KEPT.append(obj)


def _remove_socket(path: str) -> None:
    """At a clean exit: the sidecar sees the trainer is gone. Not in a forked child (the socket is its
    parent's), and the server is not shut down (see _keep_forever)."""
    if os.getpid() != _SERVER_PID:
        return
    try:
        os.unlink(path)
    except OSError:
        pass


class _Loader:
    """Runs the real loader, then `after(module)` (decides about the server). Everything else is the real
    loader's."""

    def __init__(self, real: Any, after: Any) -> None:
        self._real = real
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._real.exec_module(module)
        try:
            self._after(module)
        except Exception as exc:
            _say(f"no live collection: {type(exc).__name__}: {exc}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Finder(importlib.abc.MetaPathFinder):
    """One shot: the real spec of module `name`, whose loader runs `after(module)` once it has run."""

    def __init__(self, name: str, after: Any) -> None:
        self._name = name
        self._after = after

    def find_spec(
        self, fullname: str, path: Any, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        try:
            sys.meta_path.remove(self)  # one shot
        except ValueError:
            pass
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self._after)  # type: ignore[assignment]
                return spec
        return None


def _wanted() -> bool:
    if os.environ.get("FRSCOPE_BOOTSTRAP", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if _inherited():
        return False  # a child of the rank that serves (spawned DataLoader worker and the like)
    return os.path.isdir(_socket_dir())


def _chain() -> None:
    """Run the sitecustomize this file shadows, if there is one further down sys.path."""
    me = os.path.realpath(__file__)
    here = os.path.dirname(me)
    for entry in sys.path:
        if os.path.realpath(entry or os.getcwd()) == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None or os.path.realpath(spec.origin or "") == me:
            continue
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            _say(f"the shadowed sitecustomize {spec.origin} failed: {type(exc).__name__}: {exc}")
        return


try:
    if _wanted() and _TARGET not in sys.modules:
        sys.meta_path.insert(0, _Finder(_TARGET, lambda _module: _on_loaded()))
except Exception as _exc:  # pragma: no cover - never break the interpreter's startup
    _say(f"disabled: {type(_exc).__name__}: {_exc}")
_chain()
