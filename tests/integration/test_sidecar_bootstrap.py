"""The zero-code opt-in: an unmodified training script under torchrun, with only the bootstrap
directory on PYTHONPATH, serves one worker-server socket per rank, and the sidecar diagnoses it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from frscope.sidecar.bootstrap import BOOTSTRAP_DIR, install
from tests.integration.test_sidecar_support import config, free_port, running, wait_until

TRAIN = textwrap.dedent(
    """
    import multiprocessing as mp
    import os
    import sys
    import threading
    import time

    import torch
    import torch.distributed as dist

    threading.Thread(target=lambda: (time.sleep(150), os._exit(3)), daemon=True).start()


    def probe_child(out):
        # A spawned child (a DataLoader worker, say) inherits RANK: it must not serve a second socket.
        import torch.distributed  # noqa: F401
        import sitecustomize
        with open(out, "w") as f:
            f.write("none" if sitecustomize._SERVER is None else "served")


    def load_batch(step, rank):
        if rank == 1 and step == 2:
            while True:
                time.sleep(1)
        return torch.ones(4)


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        if rank == 0:
            child = mp.get_context("spawn").Process(target=probe_child, args=(sys.argv[1],))
            child.start()
            child.join(120)
        for step in range(4):
            dist.all_reduce(load_batch(step, rank))


    if __name__ == "__main__":
        main()
    """
)


def env_with_bootstrap(socket_dir: Path, pythonpath: Path = BOOTSTRAP_DIR) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "FRSCOPE_WORKER_SERVER_PID")}
    env.update(
        PYTHONPATH=str(pythonpath),
        FRSCOPE_SOCKET_DIR=str(socket_dir),
        TORCH_FR_BUFFER_SIZE="2000",
        OMP_NUM_THREADS="1",
    )
    return env


@pytest.mark.torch
@pytest.mark.timeout(240)
async def test_torchrun_unmodified_script_served_and_diagnosed(tmp_path: Path) -> None:
    sockets = tmp_path / "run"
    sockets.mkdir()
    volume = tmp_path / "volume"
    install(volume)  # what `frscope sidecar --install-bootstrap` does for the pod's shared volume
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    child_out = tmp_path / "child"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(script), str(child_out)]
    log = (tmp_path / "torchrun.log").open("wb")
    proc = subprocess.Popen(cmd, env=env_with_bootstrap(sockets, volume), stdout=log, stderr=subprocess.STDOUT,
                            cwd=tmp_path, start_new_session=True)
    registry = CollectorRegistry()
    try:
        async with running(config(sockets), registry) as sidecar:
            def stalled() -> bool:
                # (Rank 1 may also stall briefly in all_reduce #1 while rank 0 starts its child: a
                # capture of that episode goes stale once rank 1 enqueues again.)
                assert proc.poll() is None, (tmp_path / "torchrun.log").read_text()[-3000:]
                group = sidecar.tracker.groups.get((0, "0"))
                hung = group is not None and group.stalled and group.sample.inflight_seq == 3
                return hung and sidecar.current_capture() is not None

            await wait_until(stalled, 150, "a stall capture")
            # One socket per rank, none for torchrun's agent.
            assert sorted(p.name for p in sockets.glob("*.sock")) == ["rank-0.sock", "rank-1.sock"]
            meta = json.loads((sockets / ".rank-1.json").read_text())
            assert meta["rank"] == 1 and meta["torch_version"].startswith("2.")
            assert child_out.read_text() == "none"
            group = sidecar.tracker.groups[(0, "0")]
            assert group.stalled and group.sample.inflight_op == "all_reduce" and group.sample.inflight_seq == 3
            capture = sidecar.current_capture()
            assert capture is not None
            pieces = {r: json.loads(zlib.decompress(p)) for r, p in capture.pieces.items()}
            assert "in load_batch" in pieces[1]["stacks"] and str(script) in pieces[1]["stacks"]
            labels = {"rank": "1", "backend": "gloo", "recorder_version": "2.10", "comm_lib_version": "unknown",
                      "torch_version": meta["torch_version"]}
            assert registry.get_sample_value("frscope_recorder_info", labels) == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_clean_exit_removes_the_socket(tmp_path: Path) -> None:
    """A rank that finishes normally takes its socket away: the sidecar sees the trainer is gone."""
    sockets = tmp_path / "run"
    sockets.mkdir()
    # A stale socket of an earlier container run, which nobody serves any more.
    import socket as so

    stale = so.socket(so.AF_UNIX)
    stale.bind(str(sockets / "rank-0.sock"))
    stale.close()
    code = textwrap.dedent(
        """
        import os, socket, time, torch, torch.distributed as dist
        dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:PORT")
        sock = os.path.join(os.environ["FRSCOPE_SOCKET_DIR"], "rank-0.sock")
        for _ in range(600):  # the bootstrap serves once it sees the process group
            try:
                socket.socket(socket.AF_UNIX).connect(sock)
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError("never served")
        dist.all_reduce(torch.ones(2))
        dist.destroy_process_group()
        print("trained")
        """
    ).replace("PORT", str(free_port()))
    env = env_with_bootstrap(sockets)
    env["RANK"] = "0"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=100, cwd=tmp_path)
    assert done.returncode == 0 and b"trained" in done.stdout, done.stderr.decode()[-3000:]
    assert b"frscope bootstrap" not in done.stderr  # no complaint: the stale socket was replaced
    assert not (sockets / "rank-0.sock").exists()
    assert json.loads((sockets / ".rank-0.json").read_text())["rank"] == 0


def _finder_installed(env: dict[str, str], tmp_path: Path) -> bool:
    code = "import sys; print(any(type(f).__name__ == '_Finder' for f in sys.meta_path))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == b"True"


def test_hook_only_where_switched_on_and_keeps_a_shadowed_sitecustomize(tmp_path: Path) -> None:
    """The import hook goes in wherever the socket dir exists (which process is a rank is decided once
    torch.distributed is loaded: tests/integration/test_bootstrap_launchers.py); never when switched off,
    never in a child of a serving process; a shadowed sitecustomize still runs."""
    sockets = tmp_path / "run"
    sockets.mkdir()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    marker = tmp_path / "theirs-ran"
    (theirs / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('yes')\n")
    env = env_with_bootstrap(sockets, BOOTSTRAP_DIR)
    env["PYTHONPATH"] = f"{BOOTSTRAP_DIR}{os.pathsep}{theirs}"
    assert _finder_installed(env, tmp_path)
    assert marker.read_text() == "yes"
    env["FRSCOPE_WORKER_SERVER_PID"] = "1"  # inherited from a serving parent
    assert not _finder_installed(env, tmp_path)
    del env["FRSCOPE_WORKER_SERVER_PID"]
    env["FRSCOPE_BOOTSTRAP"] = "0"
    assert not _finder_installed(env, tmp_path)
    env["FRSCOPE_BOOTSTRAP"] = "1"
    env["FRSCOPE_SOCKET_DIR"] = str(tmp_path / "no-such-dir")
    assert not _finder_installed(env, tmp_path)


def test_print_pythonpath_is_the_bootstrap_dir() -> None:
    done = subprocess.run([sys.executable, "-m", "frscope", "sidecar", "print-pythonpath"], capture_output=True,
                          timeout=60, check=True)
    assert Path(done.stdout.decode().strip()) == BOOTSTRAP_DIR
    # It never needs frscope (or anything but the standard library) in the trainer's image: neither the
    # sitecustomize nor what it imports from beside it (the collective timer, the debug-server pointer).
    for name in ("sitecustomize.py", "_frscope_timings.py", "_frscope_debug_server.py"):
        source = (BOOTSTRAP_DIR / name).read_text()
        assert "import frscope" not in source and "from frscope" not in source, name


DEBIAN_PYTHON = Path("/usr/bin/python3")


@pytest.mark.skipif(not any(Path("/usr/lib").glob("python3*/sitecustomize.py")) or not DEBIAN_PYTHON.exists(),
                    reason="no distribution Python with its own sitecustomize here")
def test_chains_to_the_distributions_own_sitecustomize(tmp_path: Path) -> None:
    """Debian's python3 ships /usr/lib/python3.X/sitecustomize.py; with the bootstrap first on
    PYTHONPATH, Python imports ours, and ours runs Debian's too (`-v` names every module it executes)."""
    sockets = tmp_path / "run"
    sockets.mkdir()
    done = subprocess.run([str(DEBIAN_PYTHON), "-v", "-c", "pass"], env=env_with_bootstrap(sockets),
                          capture_output=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    executed = [line for line in done.stderr.decode().splitlines()
                if line.startswith("# code object from") and "sitecustomize" in line]
    assert len(executed) == 2, executed
    assert str(BOOTSTRAP_DIR) in executed[0] and "/usr/lib/python3" in executed[1], executed
