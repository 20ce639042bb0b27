"""What one hostile dump may cost, stated once, and the small checks that enforce it.

A dump is untrusted input: a few crafted bytes must not exhaust memory, hang the run, or crash the
reader of every other rank. Every bound frscope puts on a dump's contents lives here, so that the
loader, the normalizer and the messages agree on them.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import resource
except ImportError:  # not on POSIX
    resource = None  # type: ignore[assignment]

# Ranks (and so world sizes) above this are refused: the default group's members are `range(world)`,
# so a rank of 10**12 in one file would make every reader allocate terabytes. 2**20 (1,048,576) is far
# above any real job; a larger one can raise it here.
MAX_RANK = 1 << 20

# Sequence numbers, record ids and times are int64 in torch; anything outside is not a recorder's.
MAX_INT64 = (1 << 63) - 1

# Decoded objects of one file may take at most this multiple of the file's size in memory (plus the
# floor, for small files). Real dumps take ~9x (pickle) and ~5x (JSON) of their size once decoded.
MEMORY_MULTIPLE = 16
MEMORY_FLOOR_BYTES = 64 * 1024 * 1024

# JSON: every container starts with '{' or '['. Real dumps have ~85 bytes per container; a file
# made of '[],' costs ~27x its size in list objects. Counting the brackets (an upper bound: brackets
# in strings count too) refuses such files before json.loads builds anything.
MIN_JSON_BYTES_PER_CONTAINER = 8

# Text taken from a dump into a message or a name: at most this many characters.
MAX_TEXT = 120

# CPU time one file's decoding may take: a floor plus so much per MiB of the file. Real dumps decode at
# tens of MiB per CPU-second on the slowest (reference) path; a pickle of 150,000 int keys that all hash
# alike (2 MiB) takes minutes, quadratically, inside one opcode, where no check between opcodes runs.
CPU_FLOOR_S = 5.0
CPU_S_PER_MIB = 1.0
# A gzipped file is budgeted as if this many times its size (real dumps compress 5-10x).
GZIP_RATIO = 32


def memory_budget(size: int) -> int:
    """Bytes the decoded objects of a `size`-byte file may take."""
    return MEMORY_MULTIPLE * size + MEMORY_FLOOR_BYTES


def cpu_budget_s(size: int, gzipped: bool = False) -> float:
    """CPU seconds the decoding of a `size`-byte file may take."""
    return CPU_FLOOR_S + CPU_S_PER_MIB * size * (GZIP_RATIO if gzipped else 1) / (1 << 20)


def file_cpu_budget_s(path: Path) -> float:
    """`cpu_budget_s` of a file on disk, from its size and gzip magic."""
    try:
        with path.open("rb") as handle:
            gzipped = handle.read(2) == b"\x1f\x8b"
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return cpu_budget_s(0)
    return cpu_budget_s(size, gzipped)


def cpu_used_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF) if resource is not None else None
    return usage.ru_utime + usage.ru_stime if usage is not None else 0.0


@contextmanager
def cpu_time_cap(seconds: float) -> Iterator[None]:
    """While decoding one file, let this process use at most `seconds` more CPU time; past that the
    kernel ends it with SIGXCPU. The work that overruns is one C call (a dict
    insertion that probes every earlier key): no check inside the process can interrupt it, so the cap
    is for processes that exist to decode (the loader's workers, `isolate`'s children), whose parent
    reports the death as this file's problem. The soft limit is restored afterwards; no core file."""
    if resource is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    cap = math.ceil(cpu_used_s() + seconds)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield
        return
    core = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, core[1]))
    resource.setrlimit(resource.RLIMIT_CPU, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def rss_bytes() -> int | None:
    """This process's resident memory (Linux), or None where it cannot be read cheaply."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _vm_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[0]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def address_space_cap(budget: int) -> Iterator[None]:
    """While decoding one file, let the process grow by at most `budget` bytes of address space.

    The memory check between input chunks cannot see one opcode that allocates at once (a pickle's
    LONG_BINPUT with index 2**30 resizes the memo to 16 GiB: ten bytes that kill the machine). With a
    soft RLIMIT_AS the allocation fails with MemoryError instead. Only in a single-threaded process (the
    CLI, the loader's worker processes): the limit is process-wide, and another thread must not pay for
    this file. The soft limit is restored afterwards (the hard limit is never touched)."""
    vm = _vm_bytes()
    if resource is None or vm is None or threading.active_count() != 1:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm + budget
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def bounded_int(value: Any, lo: int = 0, hi: int = MAX_INT64) -> int | None:
    """An int (not bool) in [lo, hi], else None. Floats only when finite and whole: NaN/inf in a time
    or sequence field is 'not recorded', never an exception."""
    if type(value) is int:
        return value if lo <= value <= hi else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):  # an int subclass (none come from our decoders; be exact anyway)
        value = int(value)
        return value if lo <= value <= hi else None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            return None
        whole = int(value)
        return whole if lo <= whole <= hi else None
    if isinstance(value, str) and 0 < len(value) <= 20:
        try:
            return bounded_int(int(value), lo, hi)
        except ValueError:
            return None
    return None


def finite_float(value: Any) -> float | None:
    """A finite float from an int/float/short numeric string; NaN, inf and junk -> None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        if value.bit_length() > 1000:
            return None
        return float(value)
    if isinstance(value, str) and 0 < len(value) <= 40:
        try:
            got = float(value)
        except ValueError:
            return None
        return got if math.isfinite(got) else None
    return None


def valid_rank(value: Any) -> int | None:
    """A global rank: an int in [0, MAX_RANK)."""
    return bounded_int(value, 0, MAX_RANK - 1)


def text(value: Any, limit: int = MAX_TEXT) -> str | None:
    """A dump's string, capped; None for anything that is not a string (never str() of an unknown
    object: a few hundred bytes of shared references can have a repr of 2**100 characters)."""
    if not isinstance(value, str):
        return None
    if len(value) > limit:
        return value[:limit] + "..."
    return value


def printable(value: str, limit: int = MAX_TEXT) -> str:
    """A dump's string for a message: capped, control characters (terminal escapes) escaped."""
    shown = value[:limit]
    if not shown.isprintable():
        shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in shown)
    return shown + ("..." if len(value) > limit else "")


def describe(value: Any, limit: int = MAX_TEXT) -> str:
    """A bounded, printable description of any decoded value for an error message. Type-checked
    before formatting: only strings and small numbers are shown, never a container's repr, never bytes."""
    if isinstance(value, str):
        shown = value[:limit]
        return repr(shown) + ("..." if len(value) > limit else "")
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 64:
            return f"an integer of {value.bit_length()} bits"
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple, dict)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"
