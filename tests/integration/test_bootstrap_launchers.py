"""The sitecustomize bootstrap under every way a rank is started, in the environment each controller
really puts on the container: one socket per rank, served by that rank's own process; none by
torchrun's agent, none by a DataLoader worker; a restarted worker serves again.

Each case runs real processes on loopback: "pods" are process trees with their own socket dir (what
the pod's shared volume is), the ranks run tests/integration/launched_rank.py, an unmodified script
with only the bootstrap on PYTHONPATH. Who serves a socket is read from the socket itself
(SO_PEERCRED: the pid of the process that listens), and compared with the pid each rank reports.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import time
import venv
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from frscope.sidecar.bootstrap import BOOTSTRAP_DIR
from tests.integration.test_sidecar_support import free_port
from tests.integration.torch_venvs import MINORS, OWN_MINOR, python_for

RANK_SCRIPT = Path(__file__).with_name("launched_rank.py")
# Variables a controller or launcher sets; none may leak in from the environment pytest runs in.
_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                "JOB_COMPLETION_INDEX")
_LAUNCH_PREFIXES = ("PET_", "TORCHELASTIC_", "FRSCOPE_", "TORCH_WORKER_SERVER")


# --- What each controller puts on the trainer container, read from its source -----------------------

def pytorchjob_env(pod_index: int, *, replicas: int, port: int, nproc: int | None = None) -> dict[str, str]:
    """Kubeflow training operator v1.8.1, a PyTorchJob with a Master replica and no elasticPolicy
    (pkg/controller.v1/pytorch/envvar.go `setPodEnv`, master.go): MASTER_* and PET_MASTER_* name the
    master pod (here: loopback); WORLD_SIZE = replicas x nprocPerNode; RANK = PET_NODE_RANK = the pod's
    index (Worker index + 1); PET_NPROC_PER_NODE only when nprocPerNode is set; PET_NNODES = replicas."""
    env = {
        "PYTHONUNBUFFERED": "1",
        "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
        "MASTER_ADDR": "127.0.0.1", "PET_MASTER_ADDR": "127.0.0.1",
        "WORLD_SIZE": str(replicas * (nproc or 1)),
        "RANK": str(pod_index), "PET_NODE_RANK": str(pod_index),
        "PET_NNODES": str(replicas),
    }
    if nproc is not None:
        env["PET_NPROC_PER_NODE"] = str(nproc)
    return env


def pytorchjob_elastic_env(*, workers: int, nproc: int, rdzv_port: int, max_restarts: int | None = None,
                           ) -> dict[str, str]:
    """The same operator with an elasticPolicy and Worker replicas only (elastic.go `Generate`):
    PET_RDZV_ENDPOINT = <job>-worker-0:<port> (here: loopback), PET_RDZV_BACKEND = c10d (the default),
    PET_NNODES = Worker replicas (no min/max given), PET_MAX_RESTARTS and PET_NPROC_PER_NODE from the
    policy. No Master replica: no MASTER_*, WORLD_SIZE or RANK."""
    env = {
        "PYTHONUNBUFFERED": "1",
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{rdzv_port}", "PET_RDZV_BACKEND": "c10d",
        "PET_NNODES": str(workers), "PET_NPROC_PER_NODE": str(nproc),
    }
    if max_restarts is not None:
        env["PET_MAX_RESTARTS"] = str(max_restarts)
    return env


def trainer_env(node_index: int, *, nodes: int, nproc: int, port: int) -> dict[str, str]:
    """Kubeflow Trainer v2.3.0's torch runtime plugin (pkg/runtime/framework/plugins/torch/torch.go
    `EnforceMLPolicy`, names in pkg/constants/constants.go): PET_NNODES, PET_NPROC_PER_NODE,
    PET_NODE_RANK (the Job completion index, from the pod's annotation), PET_MASTER_ADDR (the first
    node's pod; here: loopback), PET_MASTER_PORT (29500 there). The JobSet's Indexed Job adds
    JOB_COMPLETION_INDEX (kubernetes pkg/controller/job/indexed_job_utils.go). No RANK, no WORLD_SIZE."""
    return {
        "PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": str(node_index),
        "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port), "JOB_COMPLETION_INDEX": str(node_index),
    }


# --- The cases -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pod:
    name: str
    argv: list[str]
    env: dict[str, str]
    ranks: tuple[int, ...]  # the ranks whose sockets belong in this pod's socket dir


@dataclass(frozen=True)
class Case:
    id: str
    pods: Callable[[Path, list[int], str], list[Pod]]  # (out dir, free ports, the trainer's python) -> pods
    restart: int = 0  # torchrun's restart count of the attempt that must be serving at the end
    loader: bool = False
    marks: list[Any] = field(default_factory=list)


def _torchrun(python: str) -> list[str]:
    script = Path(python).with_name("torchrun")
    return [str(script)] if script.exists() else [python, "-m", "torch.distributed.run"]


def _rank(out: Path, *extra: str) -> list[str]:
    return [str(RANK_SCRIPT), str(out), *extra]


def plain_none(out: Path, ports: list[int], python: str) -> list[Pod]:
    # One `python` per rank on one host; the caller sets what torchrun would.
    return [Pod("host", [python, *_rank(out, "--loader", "fork")],
                {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(ports[0])}, (r,)) for r in range(2)]


def plain_pytorchjob(out: Path, ports: list[int], python: str) -> list[Pod]:
    # Master + 1 Worker replica, `python train.py` (no nprocPerNode).
    return [Pod(f"pod{i}", [python, *_rank(out, "--loader", "fork")],
                pytorchjob_env(i, replicas=2, port=ports[0]), (i,)) for i in range(2)]


def plain_trainer(out: Path, ports: list[int], python: str) -> list[Pod]:
    # A TrainJob with numNodes 2 whose command is `python train.py` (the script reads the index).
    return [Pod(f"node{i}", [python, *_rank(out, "--rank-from", "job-index", "--loader", "spawn")],
                trainer_env(i, nodes=2, nproc=1, port=ports[0]), (i,)) for i in range(2)]


def torchrun_static_none(out: Path, ports: list[int], python: str) -> list[Pod]:
    return [Pod(f"node{i}", [*_torchrun(python), "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1",
                             "--master-addr", "127.0.0.1", "--master-port", str(ports[0]), *_rank(out)], {}, (i,))
            for i in range(2)]


def torchrun_static_pytorchjob(out: Path, ports: list[int], python: str) -> list[Pod]:
    # Master + 1 Worker, nprocPerNode 1, command `torchrun train.py`: torchrun reads PET_*, and its
    # agent has RANK (the pod's index) in its environment.
    return [Pod(f"pod{i}", [*_torchrun(python), *_rank(out, "--loader", "fork")],
                pytorchjob_env(i, replicas=2, nproc=1, port=ports[0]), (i,)) for i in range(2)]


def torchrun_static_trainer(out: Path, ports: list[int], python: str) -> list[Pod]:
    return [Pod(f"node{i}", [*_torchrun(python), *_rank(out)], trainer_env(i, nodes=2, nproc=1, port=ports[0]), (i,))
            for i in range(2)]


def torchrun_local2_pytorchjob(out: Path, ports: list[int], python: str) -> list[Pod]:
    # The layout of the bug report: one Master pod, nprocPerNode 2, `torchrun train.py`; RANK=0 on the
    # container, two local ranks. DataLoader workers started by spawn.
    return [Pod("pod0", [*_torchrun(python), *_rank(out, "--loader", "spawn")],
                pytorchjob_env(0, replicas=1, nproc=2, port=ports[0]), (0, 1))]


def torchrun_c10d_none(out: Path, ports: list[int], python: str) -> list[Pod]:
    return [Pod(f"node{i}", [*_torchrun(python), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                             "--rdzv-endpoint", f"127.0.0.1:{ports[0]}", "--rdzv-id", "job", *_rank(out)], {}, ())
            for i in range(2)]


def torchrun_c10d_pytorchjob(out: Path, ports: list[int], python: str) -> list[Pod]:
    # 2 Worker replicas with an elasticPolicy (c10d rendezvous on worker-0): `torchrun train.py`.
    return [Pod(f"pod{i}", [*_torchrun(python), *_rank(out, "--loader", "fork")],
                pytorchjob_elastic_env(workers=2, nproc=1, rdzv_port=ports[0]), ()) for i in range(2)]


# torch's own restart bug, not the bootstrap's: torchrun's c10d rendezvous (2.5 on; 2.13, 2.14 and 2.15
# alike) keeps one TCPStore for every attempt and init_process_group's keys carry no attempt, so a
# restarted rank can read the dead attempt's gloo address and fail with "Connection refused" (or hang on
# a reused port). Seen here without frscope too: a plain torchrun --max-restarts 1 job whose rank 1 dies
# failed 3 of 6 runs, 0 of 6 with torch's opt-out TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh store per
# attempt); pytorch/pytorch#135712 and #167288 describe it. The restart cases take the opt-out
# so that they test the bootstrap's part: a restarted worker serves again, with its restart count.
_FRESH_STORE_PER_ATTEMPT = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def restart_none(out: Path, ports: list[int], python: str) -> list[Pod]:
    # The dying rank's forked DataLoader workers outlive it for a few seconds, into the restart.
    return [Pod("host", [*_torchrun(python), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                         *_rank(out, "--die-once", "--loader", "fork")], dict(_FRESH_STORE_PER_ATTEMPT), (0, 1))]


def restart_pytorchjob(out: Path, ports: list[int], python: str) -> list[Pod]:
    # One Worker replica with elasticPolicy maxRestarts 1 and nProcPerNode 2.
    return [Pod("pod0", [*_torchrun(python), *_rank(out, "--die-once", "--loader", "fork")],
                pytorchjob_elastic_env(workers=1, nproc=2, rdzv_port=ports[0], max_restarts=1)
                | _FRESH_STORE_PER_ATTEMPT, (0, 1))]


def spawn_none(out: Path, ports: list[int], python: str) -> list[Pod]:
    return [Pod("host", [python, *_rank(out, "--rank-from", "spawn", "--spawn-port", str(ports[1]),
                                              "--loader", "fork")], {}, (0, 1))]


def spawn_pytorchjob(out: Path, ports: list[int], python: str) -> list[Pod]:
    # A Master-only PyTorchJob whose script calls mp.spawn: the parent has RANK=0 from the container.
    return [Pod("pod0", [python, *_rank(out, "--rank-from", "spawn", "--spawn-port", str(ports[1]))],
                pytorchjob_env(0, replicas=1, port=ports[0]), (0, 1))]


def spawn_trainer(out: Path, ports: list[int], python: str) -> list[Pod]:
    return [Pod("node0", [python, *_rank(out, "--rank-from", "spawn", "--spawn-port", str(ports[1]))],
                trainer_env(0, nodes=1, nproc=1, port=ports[0]), (0, 1))]


CASES = [
    Case("python-none", plain_none, loader=True),
    Case("python-pytorchjob", plain_pytorchjob, loader=True),
    Case("python-trainer", plain_trainer, loader=True),
    Case("torchrun_static-pytorchjob", torchrun_static_pytorchjob, loader=True),
    Case("torchrun_static-trainer", torchrun_static_trainer),
    Case("torchrun_nproc2-pytorchjob", torchrun_local2_pytorchjob, loader=True),
    Case("torchrun_c10d-pytorchjob", torchrun_c10d_pytorchjob, loader=True),
    Case("torchrun_max_restarts-none", restart_none, restart=1, loader=True),
    Case("mp_spawn-none", spawn_none, loader=True),
    Case("mp_spawn-pytorchjob", spawn_pytorchjob),
]
# Also written, left out of the suite for its wall time (each adds 30-60 s on two busy cores) because a
# case above takes the same path through the bootstrap; FRSCOPE_LAUNCHER_MATRIX=full runs them.
EXTRA_CASES = [
    Case("torchrun_static-none", torchrun_static_none),  # agents without RANK: as -trainer
    Case("torchrun_c10d-none", torchrun_c10d_none),  # as torchrun_c10d-pytorchjob
    # as -none, in the elastic PyTorchJob's env (PET_*, no RANK)
    Case("torchrun_max_restarts-pytorchjob", restart_pytorchjob, restart=1, loader=True),
    Case("mp_spawn-trainer", spawn_trainer),  # no RANK in the parent: as mp_spawn-none
]
# On the other torch versions (their own venvs: tests/integration/torch_venvs.py), the cases whose path
# through the bootstrap leans most on torch: the elastic agent's worker variables with spawned DataLoader
# workers, a restart, and serving once a process group exists. FRSCOPE_LAUNCHER_MATRIX=full runs every
# case, the extra ones too, on every version.
VERSION_CASES = ("torchrun_nproc2-pytorchjob", "torchrun_max_restarts-none", "mp_spawn-none")


def matrix() -> list[Any]:
    full = os.environ.get("FRSCOPE_LAUNCHER_MATRIX") == "full"
    return [pytest.param(minor, case, id=f"{minor}-{case.id}")
            for minor in MINORS for case in (CASES + EXTRA_CASES if full else CASES)
            if full or minor == OWN_MINOR or case.id in VERSION_CASES]


# --- Talking to a rank's socket ------------------------------------------------------------------

def listener_pid(path: Path) -> int:
    """The pid of the process listening on a unix socket (its credentials at listen())."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self._path))
        self.sock = sock


def post(path: Path, handler: str) -> tuple[int, bytes]:
    conn = _UnixHTTP(path)
    try:
        conn.request("POST", f"/handler/{handler}", body=b"")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# --- Running a case ----------------------------------------------------------------------------------

def base_env(socket_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCH_VARS and not k.startswith(_LAUNCH_PREFIXES) and k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(BOOTSTRAP_DIR), FRSCOPE_SOCKET_DIR=str(socket_dir), OMP_NUM_THREADS="1",
               TORCH_FR_BUFFER_SIZE="2000")
    return env


@dataclass
class Launched:
    pod: Pod
    socket_dir: Path
    log: Path
    proc: subprocess.Popen[bytes]


@contextmanager
def launched(pods: list[Pod], root: Path) -> Iterator[list[Launched]]:
    running: list[Launched] = []
    try:
        for i, pod in enumerate(pods):
            sockets = root / "pods" / f"{pod.name}" / "run"
            sockets.mkdir(parents=True, exist_ok=True)
            log = root / f"{i}-{pod.name}.log"
            env = base_env(sockets) | pod.env
            with log.open("wb") as handle:
                proc = subprocess.Popen(pod.argv, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=root,
                                        start_new_session=True)
            running.append(Launched(pod, sockets, log, proc))
        yield running
    finally:
        for item in running:
            if item.proc.poll() is None:
                below = process_tree(item.proc.pid)[1:]
                os.killpg(item.proc.pid, signal.SIGKILL)
                for pid in below:  # torchrun starts each worker in a session of its own
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            item.proc.wait(timeout=30)


def process_tree(root: int) -> list[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def logs(running: list[Launched]) -> str:
    return "\n".join(f"--- {r.log.name} (exit {r.proc.poll()})\n{r.log.read_text(errors='replace')[-4000:]}"
                     for r in running)


def workers(out: Path) -> dict[int, dict[str, Any]]:
    found = {}
    for path in out.glob("worker-*.json"):
        info = json.loads(path.read_text())
        found[int(info["rank"])] = info
    return found


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, running: list[Launched]) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        failed = [r for r in running if r.proc.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            raise AssertionError(f"{'a process failed' if failed else 'timed out'} waiting for {what}\n{logs(running)}")
        time.sleep(0.1)


def served_by(path: Path) -> int | None:
    try:
        return listener_pid(path)
    except OSError:
        return None


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(("minor", "case"), matrix())
def test_one_socket_per_rank_served_by_the_rank(minor: str, case: Case, tmp_path: Path) -> None:
    python = python_for(minor)
    out = tmp_path / "out"
    out.mkdir()
    pods = case.pods(out, [free_port(), free_port()], python)
    with launched(pods, tmp_path) as running:
        def all_reported() -> bool:
            found = workers(out)
            return sorted(found) == [0, 1] and all(w["restart"] == case.restart for w in found.values())

        wait_for(all_reported, 150, "both ranks to report", running)
        ranks = workers(out)
        # Where each rank's socket lives: the pod that says so, or (c10d: torchrun assigns the ranks)
        # the one whose socket dir holds it.
        home = {r: item for item in running for r in item.pod.ranks}
        for rank in ranks:
            home.setdefault(rank, next((i for i in running if (i.socket_dir / f"rank-{rank}.sock").exists()),
                                       running[0]))

        def served() -> bool:  # the server starts once the rank has its process group: give it a moment
            return all(served_by(home[r].socket_dir / f"rank-{r}.sock") == ranks[r]["pid"] for r in ranks)

        try:
            wait_for(served, 15, "each rank's socket served by that rank", running)
        except AssertionError:
            owners = {r: served_by(home[r].socket_dir / f"rank-{r}.sock") for r in ranks}
            raise AssertionError(f"socket owners {owners}, rank pids { {r: w['pid'] for r, w in ranks.items()} }, "
                                 f"sockets {[sorted(p.name for p in i.socket_dir.glob('*.sock')) for i in running]}"
                                 f"\n{logs(running)}") from None

        for socket_dir in {item.socket_dir for item in running}:
            # exactly the pod's own ranks' sockets: none for an agent or a DataLoader worker
            expected = sorted(f"rank-{r}.sock" for r, owner in home.items() if owner.socket_dir == socket_dir)
            assert sorted(p.name for p in socket_dir.glob("*.sock")) == expected, logs(running)
        for rank, info in ranks.items():
            path = home[rank].socket_dir / f"rank-{rank}.sock"
            status, body = post(path, "fr_trace_json")
            assert status == 200, body[:300]
            dump = json.loads(body)
            assert any("all_reduce" in str(e.get("profiling_name")) for e in dump["entries"]), dump
            meta = json.loads((home[rank].socket_dir / f".rank-{rank}.json").read_text())
            assert meta["pid"] == info["pid"] and meta["rank"] == rank
            assert meta.get("restart_count", 0) == case.restart
            if case.loader:  # the DataLoader workers are alive, and none of them serves anything
                assert len(info["loader_pids"]) == 2
                assert all(Path(f"/proc/{pid}").exists() for pid in info["loader_pids"])
        if case.loader:  # (a restart case also has the first attempt's)
            parents = [int(p.read_text()) for p in out.glob("loader-*.pid")]
            assert sum(parent in {w["pid"] for w in ranks.values()} for parent in parents) == 4, parents

        (out / "go").touch()
        for item in running:
            try:
                item.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{item.pod.name} did not finish\n{logs(running)}") from None
        text = logs(running)
        assert all(item.proc.returncode == 0 for item in running), text
        assert "[frscope bootstrap]" not in text, text
        for item in running:  # a clean exit takes the sockets away
            assert not list(item.socket_dir.glob("*.sock")), text


_CRASHING_RANK = """
import ctypes, os, sys, time
import torch.distributed  # a worker of torchrun's agent: the bootstrap serves as soon as this is loaded
# A forked DataLoader worker, say, which outlives its rank for a while; or a child forked in C, where
# Python's at-fork hooks do not run.
child = os.fork() if sys.argv[2] == "os.fork" else ctypes.CDLL(None).fork()
if child == 0:
    time.sleep(120)
    os._exit(0)
with open(sys.argv[1], "w") as handle:
    handle.write(str(child))
os._exit(1)  # the rank crashes: no clean exit, its socket file stays behind
"""


_RESTARTED_RANK = """
import os, socket, struct, sys
import torch.distributed
probe = socket.socket(socket.AF_UNIX)
probe.connect(sys.argv[1])
listener = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
print("served by", "me" if listener == os.getpid() else listener)
"""


@pytest.mark.torch
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fork", ["os.fork", "libc fork"])
def test_a_restarted_rank_serves_while_the_crashed_ones_forked_child_lives(fork: str, tmp_path: Path) -> None:
    """torchrun restarts a crashed worker within seconds, while the crashed one's forked DataLoader workers
    are still alive (they notice a dead parent only every few seconds). They must not keep its socket
    looking served: the restarted rank would decide that someone else serves it and serve nothing for the
    whole attempt (found by the max-restarts case with forked DataLoader workers). A child forked by
    Python closes its copy of the socket; one forked in C keeps it, and the restarted rank sees that the
    process that listens is gone."""
    sockets = tmp_path / "run"
    sockets.mkdir()
    path = sockets / "rank-1.sock"
    worker = {"TORCHELASTIC_RUN_ID": "job", "LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}
    env = base_env(sockets) | worker | {"TORCHELASTIC_RESTART_COUNT": "0"}
    child_file = tmp_path / "child"
    log = tmp_path / "crashed.log"
    with log.open("wb") as handle:  # (not a pipe: the child would hold it open)
        crashed = subprocess.run([sys.executable, "-c", _CRASHING_RANK, str(child_file), fork], env=env, stdout=handle,
                                 stderr=subprocess.STDOUT, timeout=100, cwd=tmp_path)
    child = int(child_file.read_text())
    try:
        assert crashed.returncode == 1, log.read_text(errors="replace")[-3000:]
        assert path.exists() and Path(f"/proc/{child}").exists()
        if fork == "os.fork":
            with pytest.raises(ConnectionRefusedError):  # the sidecar sees the rank gone, not a silent socket
                listener_pid(path)
        # The restarted worker decides when torch.distributed is loaded; nothing probes the socket before
        # (a probe nobody accepts takes a place in the listen backlog).
        restarted = subprocess.run([sys.executable, "-c", _RESTARTED_RANK, str(path)],
                                   env=env | {"TORCHELASTIC_RESTART_COUNT": "1"}, capture_output=True, timeout=100,
                                   cwd=tmp_path)
        assert restarted.returncode == 0, restarted.stderr.decode()[-3000:]
        assert restarted.stdout.split() == [b"served", b"by", b"me"], restarted.stdout
        assert b"[frscope bootstrap]" not in restarted.stderr, restarted.stderr.decode()[-3000:]
        assert Path(f"/proc/{child}").exists()  # (the child lived throughout)
    finally:
        os.kill(child, signal.SIGKILL)


# --- The image's own sitecustomize ---------------------------------------------------------------

_IMAGE_SITECUSTOMIZE = """
# The training image's own sitecustomize: it runs in every process, frscope's bootstrap or not.
import os
if os.environ.get("IMAGE_MARKS"):
    open(os.path.join(os.environ["IMAGE_MARKS"], str(os.getpid())), "w").close()
"""


def image_python(layout: str, root: Path) -> tuple[str, dict[str, str]]:
    """The trainer's Python and the env the webhook gives it, for an image with its own sitecustomize."""
    image = root / "image"
    if layout == "pythonpath":
        # The image's `ENV PYTHONPATH` names a directory with its sitecustomize; the pod template carries
        # it in the frscope.io/pythonpath annotation, and the webhook puts it after the bootstrap.
        lib = image / "lib"
        lib.mkdir(parents=True)
        (lib / "sitecustomize.py").write_text(_IMAGE_SITECUSTOMIZE)
        return sys.executable, {"PYTHONPATH": f"{BOOTSTRAP_DIR}{os.pathsep}{lib}"}
    # A venv image whose site-packages holds its sitecustomize. torch comes from the test venv (a .pth
    # line, after the image's own site-packages); frscope is not importable there, as in a real image.
    venv.create(image, symlinks=True, with_pip=False)
    site = Path(sysconfig.get_paths(vars={"base": str(image), "platbase": str(image)})["purelib"])
    (site / "sitecustomize.py").write_text(_IMAGE_SITECUSTOMIZE)
    (site / "the-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(image / "bin" / "python"), {}


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("layout", ["pythonpath", "venv"])
def test_the_images_own_sitecustomize_still_runs(layout: str, tmp_path: Path) -> None:
    """Python imports only the first `sitecustomize` on sys.path, which is the bootstrap's: it runs the
    one it shadows, in torchrun's agent, in every rank and in their spawned DataLoader workers; the ranks
    are served as in any other torchrun job (the bug report's layout: a PyTorchJob with nprocPerNode 2)."""
    python, env = image_python(layout, tmp_path)
    out, marks = tmp_path / "out", tmp_path / "marks"
    out.mkdir()
    marks.mkdir()
    pod = Pod("pod0", [*_torchrun(python), *_rank(out, "--loader", "spawn")],
              pytorchjob_env(0, replicas=1, nproc=2, port=free_port()) | env | {"IMAGE_MARKS": str(marks)}, (0, 1))
    with launched([pod], tmp_path) as running:
        wait_for(lambda: sorted(workers(out)) == [0, 1], 150, "both ranks to report", running)
        ranks = workers(out)
        sockets = running[0].socket_dir
        wait_for(lambda: all(served_by(sockets / f"rank-{r}.sock") == ranks[r]["pid"] for r in ranks), 15,
                 "each rank's socket served by that rank", running)
        assert sorted(p.name for p in sockets.glob("*.sock")) == ["rank-0.sock", "rank-1.sock"]
        ran = {int(p.name) for p in marks.iterdir()}
        assert running[0].proc.pid in ran, logs(running)  # torchrun's agent
        for info in ranks.values():
            assert info["pid"] in ran and len(info["loader_pids"]) == 2, (info, ran)
            assert set(info["loader_pids"]) <= ran, (info, ran)
        (out / "go").touch()
        running[0].proc.wait(timeout=90)
        text = logs(running)
        assert running[0].proc.returncode == 0 and "[frscope bootstrap]" not in text, text
