"""frscope against every torch minor version it supports (2.13 on): the worker server's handlers, the
recorder's format version and the fields the analyzer reads, and the bootstrap, each in a real 2-rank
torchrun job on that torch.

torch 2.13 is the test venv's own; the others live in cached venvs that `scripts/torch-venv VERSION`
builds (`make torch-venvs` builds TORCH_VERSIONS). A version whose venv is missing is skipped with
the command that builds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frscope.records import normalize_dump
from frscope.records.loader import load_file
from tests.integration.test_bootstrap_launchers import (
    RANK_SCRIPT,
    Pod,
    launched,
    listener_pid,
    post,
    wait_for,
    workers,
)
from tests.integration.test_sidecar_support import free_port
from tests.integration.torch_venvs import MINORS, python_for

# The recorder format each torch writes (the dump's top-level `version`), as measured.
FORMAT = {"2.13": "2.10", "2.14": "2.10", "2.15": "2.10"}
HANDLERS = {"fr_trace_json", "dump_traceback", "ping"}  # what the sidecar calls


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("minor", MINORS)
def test_torch_version_served_and_understood(minor: str, tmp_path: Path) -> None:
    python = python_for(minor)
    probe = subprocess.run(
        [python, "-W", "ignore", "-c", "import json, torch; from torch._C._distributed_c10d import _get_handler_names;"
         "print(json.dumps([torch.__version__, sorted(_get_handler_names())]))"],
        capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    version, handlers = json.loads(probe.stdout.splitlines()[-1])
    assert version.startswith(minor + "."), version
    assert HANDLERS <= set(handlers), handlers

    # The pickle form (what a program or the on-timeout dump writes), read through frscope's allow-listed
    # unpickler: a format it knows, every field where it looks.
    pickled = tmp_path / "nccl_trace_rank_0"
    code = ("import sys, torch, torch.distributed as dist\n"
            f"dist.init_process_group('gloo', rank=0, world_size=1, init_method='tcp://127.0.0.1:{free_port()}')\n"
            "dist.all_reduce(torch.ones(4))\n"
            "open(sys.argv[1], 'wb').write(torch._C._distributed_c10d._dump_fr_trace())\n"
            "dist.destroy_process_group()\n")
    wrote = subprocess.run([python, "-W", "ignore", "-c", code, str(pickled)], capture_output=True, text=True,
                           timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                           | {"TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"})
    assert wrote.returncode == 0, wrote.stderr[-2000:]
    dump = load_file(pickled, keep_frames=True)
    assert dump.version == FORMAT[minor] and dump.warnings == [], (dump.version, dump.warnings)
    [entry] = [e for e in dump.entries if e.op == "all_reduce"]
    assert entry.input_sizes == [[4]] and entry.frames, entry

    out = tmp_path / "out"
    out.mkdir()
    argv = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(RANK_SCRIPT), str(out)]
    with launched([Pod("host", argv, {}, (0, 1))], tmp_path) as running:
        wait_for(lambda: sorted(workers(out)) == [0, 1], 150, "both ranks to report", running)
        ranks = workers(out)
        sockets = running[0].socket_dir

        def served() -> bool:
            try:
                return all(listener_pid(sockets / f"rank-{r}.sock") == ranks[r]["pid"] for r in ranks)
            except OSError:
                return False

        wait_for(served, 15, "each rank's socket", running)
        for rank in ranks:
            path = sockets / f"rank-{rank}.sock"
            status, body = post(path, "fr_trace_json")
            assert status == 200, body[:300]
            raw = json.loads(body)
            assert raw["version"] == FORMAT[minor], f"torch {version} writes format {raw['version']}"
            dump = normalize_dump(raw, f"socket:{path}", rank)
            assert dump.warnings == [], dump.warnings  # a format frscope knows, every field where it looks
            [entry] = [e for e in dump.entries if e.op == "all_reduce"]
            assert entry.collective_seq_id >= 1 and entry.input_sizes == [[4]] and entry.input_dtypes == ["Float"]
            assert entry.time_created_ns > 0 and entry.state in ("scheduled", "started", "completed")
            status, body = post(path, "frscope_progress")  # the bootstrap's own handler
            assert status == 200 and json.loads(body)["frscope_progress"] == 1, body[:300]
            status, body = post(path, "dump_traceback")
            assert status == 200 and b"launched_rank.py" in body, body[:300]
        (out / "go").touch()
        running[0].proc.wait(timeout=90)
        log = running[0].log.read_text(errors="replace")
        assert running[0].proc.returncode == 0, log[-3000:]
        assert "[frscope bootstrap]" not in log, log[-3000:]


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_a_torch_without_the_worker_server_trains_with_one_line(tmp_path: Path) -> None:
    """A torch the bootstrap cannot serve (before 2.4, or a build without the worker server): no live
    collection, one line on stderr, training unaffected. Simulated on this torch by setting
    `_WorkerServer` to None as torch.distributed sets c10d up (torch's own modules import the name,
    so it cannot simply go): no such torch can be installed here."""
    sockets = tmp_path / "run"
    sockets.mkdir()
    code = """
import importlib.abc, sys
class Strip(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch.distributed" and not hasattr(self, "done"):  # it sets c10d up with _c10d_init()
            self.done = True  # (not leaving sys.meta_path while the import system walks it)
            C = sys.modules["torch._C"]
            init = C._c10d_init
            def stripped():
                done = init()
                C._distributed_c10d._WorkerServer = None
                return done
            C._c10d_init = stripped
        return None
sys.meta_path.insert(0, Strip())
import torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:PORT")
dist.all_reduce(torch.ones(2))
import time; time.sleep(2)  # the bootstrap's look for a process group comes and goes
dist.destroy_process_group()
print("trained")
"""
    from tests.integration.test_bootstrap_launchers import base_env
    from tests.integration.test_sidecar_support import free_port

    done = subprocess.run([sys.executable, "-c", code.replace("PORT", str(free_port()))], env=base_env(sockets),
                          capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("[frscope bootstrap]")]
    assert len(lines) == 1 and "no live collection" in lines[0], done.stderr[-3000:]
    assert not list(sockets.iterdir())
