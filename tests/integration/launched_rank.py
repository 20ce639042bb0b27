"""One training process of the launcher matrix (tests/integration/test_bootstrap_launchers.py), run
the way a user's script is: under `python`, `torchrun` or `torch.multiprocessing.spawn`, with only the
frscope bootstrap on PYTHONPATH. Standard library and torch only (it runs in the test venvs of every
torch version too).

    launched_rank.py OUT_DIR [--rank-from env|job-index|spawn] [--spawn-port P] [--loader fork|spawn]
                     [--die-once]

Each rank joins a gloo group, runs one all_reduce, optionally starts a DataLoader with two persistent
worker processes, writes OUT_DIR/worker-<rank>.json (rank, pid, restart count, DataLoader worker
pids), then waits until OUT_DIR/go exists, so the test can look at the sockets while every process is
alive. --die-once: rank 1 of torchrun's first attempt dies (os._exit, leaving its socket behind) once
its socket answers, and torchrun restarts the group.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

WAIT_S = 150


class Numbers(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index])


def note_loader_worker(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    out_dir = info.dataset.out_dir  # type: ignore[union-attr]
    with open(os.path.join(out_dir, f"loader-{os.getpid()}.pid"), "w") as handle:
        handle.write(str(os.getppid()))


def write_json(path: str, obj: object) -> None:
    with open(f"{path}.tmp", "w") as handle:
        json.dump(obj, handle)
    os.replace(f"{path}.tmp", path)


def wait_until_served(rank: int) -> None:
    path = os.path.join(os.environ["FRSCOPE_SOCKET_DIR"], f"rank-{rank}.sock")
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(path)
            return
        except OSError:
            time.sleep(0.1)
        finally:
            probe.close()
    raise SystemExit(f"rank {rank}: {path} never served")


def run(index: int, rank_from: str, args: argparse.Namespace) -> None:
    if rank_from == "env":  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from the launcher or the controller
        dist.init_process_group("gloo")
    elif rank_from == "job-index":  # Trainer v2 / JobSet with plain python: the pod's completion index
        env = os.environ
        dist.init_process_group("gloo", rank=int(env["JOB_COMPLETION_INDEX"]), world_size=int(env["PET_NNODES"]),
                                init_method=f"tcp://{env['PET_MASTER_ADDR']}:{env['PET_MASTER_PORT']}")
    else:  # torch.multiprocessing.spawn: the index is the rank
        dist.init_process_group("gloo", rank=index, world_size=2, init_method=f"tcp://127.0.0.1:{args.spawn_port}")
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    loader_pids: list[int] = []
    keep = None
    if args.loader:
        data = Numbers()
        data.out_dir = args.out_dir  # type: ignore[attr-defined]
        loader = torch.utils.data.DataLoader(data, batch_size=1, num_workers=2, persistent_workers=True,
                                             multiprocessing_context=args.loader, worker_init_fn=note_loader_worker)
        batches = list(loader)  # both workers are up, and stay up (persistent) until the end
        assert len(batches) == 4
        keep = loader
        loader_pids = [w.pid for w in loader._iterator._workers]  # type: ignore[union-attr]
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    write_json(os.path.join(args.out_dir, f"worker-{rank}.json"),
               {"rank": rank, "pid": os.getpid(), "restart": restart, "loader_pids": loader_pids})
    if args.die_once and rank == 1 and restart == 0:
        wait_until_served(rank)
        os._exit(1)  # a crash: no clean exit, the socket file stays behind
    go = os.path.join(args.out_dir, "go")
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: no go after {WAIT_S} s")
        time.sleep(0.1)
    dist.barrier()
    del keep
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--rank-from", choices=("env", "job-index", "spawn"), default="env")
    parser.add_argument("--spawn-port", type=int, default=0)
    parser.add_argument("--loader", choices=("fork", "spawn"))
    parser.add_argument("--die-once", action="store_true")
    args = parser.parse_args()
    if args.rank_from == "spawn":
        torch.multiprocessing.spawn(run, args=("spawn", args), nprocs=2)
    else:
        run(0, args.rank_from, args)


if __name__ == "__main__":
    sys.exit(main())
