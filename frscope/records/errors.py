"""Typed errors for dump loading. Each names the file (and rank/field when known) it is about."""

from __future__ import annotations


class DumpError(Exception):
    """A dump that cannot be used. `source` names the file (or socket) it came from."""

    kind = "unreadable"

    def __init__(self, source: str, message: str, *, rank: int | None = None, field: str | None = None):
        self.source = source
        self.rank = rank
        self.field = field
        where = f" (rank {rank})" if rank is not None else ""
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{source}{where}:{what} {message}")
        self.message = message

    @property
    def what(self) -> str:
        """The message with the field it is about (a problem's text: the source and rank go beside it)."""
        return f"field {self.field!r}: {self.message}" if self.field else self.message

    def __reduce__(self) -> tuple[object, ...]:
        # Raised in decoder processes too: travel back whole (the keyword-only fields included).
        return (_rebuild, (type(self), self.source, self.message, self.rank, self.field))


def _rebuild(cls: type[DumpError], source: str, message: str, rank: int | None, field: str | None) -> DumpError:
    return cls(source, message, rank=rank, field=field)


class DumpTooLarge(DumpError):
    kind = "too-large"


class TruncatedDump(DumpError):
    """Empty, cut short, or still being written (torch writes the on-timeout dump in place)."""

    kind = "truncated"


class UnsafePickle(DumpError):
    """The pickle asked for a global outside the allow-list; nothing was executed."""

    kind = "unsafe"


class UnknownFormat(DumpError):
    kind = "unknown-format"


class MalformedDump(DumpError):
    """Decoded, but not shaped like a Flight Recorder dump."""

    kind = "malformed"


class DumpTooSlow(DumpError):
    """Decoding took longer than the file's CPU-time cap (`limits.cpu_budget_s`); it was stopped."""

    kind = "too-slow"
