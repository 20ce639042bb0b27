"""Small formatting helpers shared by the analysis' one-line verdicts and the renderers."""

from __future__ import annotations

from collections.abc import Iterable


def fmt_ranks(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (1,024 ranks must fit on a line)."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "none"
    parts: list[str] = []
    start = prev = ordered[0]
    for rank in ordered[1:]:
        if rank == prev + 1:
            prev = rank
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = rank
    parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def plural(ranks: Iterable[int], word: str = "rank", max_parts: int = 6) -> str:
    """'rank 3', 'ranks 0-2, 5'; long scattered lists (one rank per host of 128) become
    '63 ranks (10, 26, 42, 58, ...)' so a verdict stays one readable sentence."""
    listed = sorted(set(ranks))
    text = fmt_ranks(listed)
    parts = text.split(", ")
    if len(parts) > max_parts:
        text = f"({', '.join(parts[:4])}, ...)"
        return f"{len(listed)} {word}s {text}"
    return f"{word}{'s' if len(listed) != 1 else ''} {text}"


def fmt_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
