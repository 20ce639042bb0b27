"""The zero-code opt-in: a `sitecustomize.py` that starts torch's worker server in each rank.

This directory goes on the trainer's PYTHONPATH as is (`frscope sidecar print-pythonpath`), or is
copied into a shared volume with `install()` (`frscope sidecar --install-bootstrap DIR`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

BOOTSTRAP_DIR = Path(__file__).resolve().parent
FILES = ("sitecustomize.py", "_frscope_timings.py", "_frscope_debug_server.py")


def install(target: Path) -> list[Path]:
    """Copy the bootstrap into `target` (created if needed), each file renamed into place."""
    target.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name in FILES:
        dest = target / name
        tmp = target / f".{name}.tmp"
        shutil.copyfile(BOOTSTRAP_DIR / name, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        written.append(dest)
    return written
