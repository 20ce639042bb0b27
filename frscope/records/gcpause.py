"""Pause the cyclic garbage collector around bulk object creation."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Millions of small objects from the unpickler (and the analysis' indexes) make the cyclic GC
    rescan them again and again: 3x the load time at 1,024 ranks. Nothing made here forms cycles
    worth collecting before the work is done."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
