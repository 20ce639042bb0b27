"""A hand-written job under torch.multiprocessing.spawn (the launcher of many single-node scripts): the parent
spawns WORLD_SIZE ranks, each runs job.py's scenario (argv[1]) with its rank in the environment; when a rank
fails, spawn's join ends the others."""

import os
import runpy
import sys

import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))


def _rank(rank, scen, world):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    sys.argv = [os.path.join(HERE, "job.py"), scen]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    world = int(os.environ["WORLD_SIZE"])
    mp.spawn(_rank, args=(sys.argv[1], world), nprocs=world)
