"""frscope bootstrap: serve torch's worker server on `<FRSCOPE_SOCKET_DIR>/rank-<RANK>.sock` in every
training process, with no change to the training code.

Put this file's directory on the trainer's PYTHONPATH (`frscope sidecar print-pythonpath`, or the
volume that `frscope sidecar --install-bootstrap DIR` fills). Python imports `sitecustomize` at
startup; this one acts only in a process that has RANK set (torchrun's workers, not its agent) and
whose socket dir exists. It installs a meta-path finder for `torch.distributed` whose loader first
runs the real module and then starts `_WorkerServer` (starting it while torch.distributed is still
importing fails: `cannot import name '_WorkerServer'`). Nothing happens in a process that never
imports torch.distributed.

Environment: FRSCOPE_SOCKET_DIR (default /run/frscope), FRSCOPE_BOOTSTRAP=0 to switch it off.
A child that inherits RANK (a spawned DataLoader worker) does not start a second server: the
serving process leaves its pid in FRSCOPE_WORKER_SERVER_PID. Any other `sitecustomize` that this
file shadows on sys.path is still run. The bootstrap never raises into the training process; a
failure is one line on stderr.

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
import sys
import time
from types import ModuleType
from typing import Any

_TARGET = "torch.distributed"
_SERVER: Any = None  # kept referenced for the life of the process: torch stops the server on collection


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"[frscope bootstrap] {message}\n")
    except Exception:
        pass


def _stale(path: str) -> bool:
    """A socket file nobody listens on (left by an earlier process of this container)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:
        return True
    finally:
        probe.close()
    return False


def _start_server() -> None:
    global _SERVER
    rank = os.environ.get("RANK", "")
    socket_dir = os.environ.get("FRSCOPE_SOCKET_DIR", "/run/frscope")
    path = os.path.join(socket_dir, f"rank-{rank}.sock")
    try:
        if os.path.exists(path):
            if not _stale(path):
                _say(f"{path} is already served by another process; not starting a second server")
                return
            os.unlink(path)
        from torch._C._distributed_c10d import _WorkerServer

        _register_progress_handler()
        _SERVER = _WorkerServer(path)
        # The sidecar runs as its own user (the chart's 65532), the trainer often as root: connecting to
        # a unix socket needs write permission on it. The directory is the pod's own shared volume.
        os.chmod(path, 0o666)
        os.environ["FRSCOPE_WORKER_SERVER_PID"] = str(os.getpid())
        _write_meta(socket_dir, rank, path)
        import atexit

        atexit.register(_stop_server, path)
    except Exception as exc:
        _say(f"could not start torch's worker server on {path}: {type(exc).__name__}: {exc}")


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


def _register_progress_handler() -> None:
    try:
        from torch._C._distributed_c10d import _register_handler

        _register_handler("frscope_progress", _progress)
    except Exception as exc:  # an older torch: the sidecar polls fr_trace_json every time
        _say(f"no frscope_progress handler ({type(exc).__name__}: {exc}); the sidecar polls full recorders")


def _write_meta(socket_dir: str, rank: str, path: str) -> None:
    torch = sys.modules.get("torch")
    meta = {
        "rank": int(rank),
        "pid": os.getpid(),
        "socket": path,
        "torch_version": str(getattr(torch, "__version__", "")),
        "hostname": socket.gethostname(),
        "started_at_ns": time.time_ns(),
    }
    target = os.path.join(socket_dir, f".rank-{rank}.json")
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as handle:
            json.dump(meta, handle)
        os.replace(tmp, target)
    except OSError:
        pass


def _stop_server(path: str) -> None:
    global _SERVER
    server, _SERVER = _SERVER, None
    try:
        if server is not None:
            server.shutdown()
        os.unlink(path)  # a clean exit removes the socket: the sidecar sees the trainer is gone
    except Exception:
        pass


class _Loader:
    """Runs the real loader, then starts the server. Everything else is the real loader's."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._real.exec_module(module)
        _start_server()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Any, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
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
                    spec.loader = _Loader(spec.loader)  # type: ignore[assignment]
                return spec
        return None


def _wanted() -> bool:
    rank = os.environ.get("RANK", "")
    if not rank.isdigit():
        return False
    if os.environ.get("FRSCOPE_BOOTSTRAP", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    owner = os.environ.get("FRSCOPE_WORKER_SERVER_PID")
    if owner and owner != str(os.getpid()):
        return False  # a child of the rank that serves (spawned DataLoader worker and the like)
    return os.path.isdir(os.environ.get("FRSCOPE_SOCKET_DIR", "/run/frscope"))


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
        sys.meta_path.insert(0, _Finder())
except Exception as _exc:  # pragma: no cover - never break the interpreter's startup
    _say(f"disabled: {type(_exc).__name__}: {_exc}")
_chain()
