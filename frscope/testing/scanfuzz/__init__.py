"""A differential fuzzer of the C dump scanners (`records/_frscan*.c`) against the pure-Python path.

Seeds are real dumps (tests/data: torch's pickles and JSON, frscope's snapshot pieces, random programs' files)
and snapshot envelopes made of the pieces; `mutate` makes hostile inputs of them and `oracle` checks each one
(the scanner's reading equals the reference's, no foreign exception, bounded time). scripts/fuzz_scanners.py
runs it for a while (under AddressSanitizer: its docstring says how); tests/unit/test_scanner_hostile.py runs a
few hundred seeded mutations.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from frscope.testing.scanfuzz.mutate import JSON_MUTATORS, mutate
from frscope.testing.scanfuzz.oracle import Finding, check_body, check_file
from frscope.testing.scanfuzz.pickles import PICKLE_MUTATORS
from frscope.wire.snapshot import snapshot_envelope_bytes, snapshot_head

TARGETS = ("pickle", "json", "envelope")


def _read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def seeds(data_dir: Path, extra: list[Path] | None = None, max_bytes: int = 256 * 1024) -> dict[str, list[bytes]]:
    """target -> its seeds: every pickle and JSON dump under `data_dir` (and `extra` folders) up to
    `max_bytes`, and envelopes of 1-4 snapshot pieces."""
    out: dict[str, list[bytes]] = {t: [] for t in TARGETS}
    pieces: list[bytes] = []
    for root in [data_dir, *(extra or [])]:
        for path in sorted(root.rglob("*")):
            if not path.is_file() or "stack" in path.name or path.suffix in (".md", ".txt") or path.stem == "truth":
                continue
            data = _read(path)
            if not data or len(data) > max_bytes:
                continue
            if data[:1] == b"\x80":
                out["pickle"].append(data)
            elif data.lstrip()[:1] == b"{":
                out["json"].append(data)
                if b'"frscope_snapshot"' in data[:200]:
                    pieces.append(data)
    rng = random.Random(0)
    for i in range(min(40, len(pieces))):
        chosen = rng.sample(pieces, min(len(pieces), 1 + i % 4))
        head = snapshot_head(pod=f"p-{i}", namespace="ns", node="n", captured_at_ns=1_700_000_000_000_000_000 + i,
                             reason="stall")
        errors = [{"rank": 9, "message": "gone"}] if i % 3 == 0 else []
        out["envelope"].append(snapshot_envelope_bytes(head, chosen, errors))  # type: ignore[arg-type]
    return out


@dataclass
class Result:
    target: str
    data: bytes
    how: str
    findings: list[Finding]


def inputs(target: str, pool: list[bytes], rng: random.Random, cut_seeds: int = 0) -> Iterator[tuple[bytes, str]]:
    """Every cut of the `cut_seeds` smallest seeds of at least 1 KiB, then endless mutations of `pool`'s
    seeds for `target` (now and then a seed as it is)."""
    for seed in sorted((s for s in pool if len(s) >= 1024), key=len)[:cut_seeds]:
        for end in range(len(seed)):
            yield seed[:end], f"cut {end}/{len(seed)}"
    mutators = PICKLE_MUTATORS if target == "pickle" else JSON_MUTATORS
    while True:
        seed = rng.choice(pool)
        if rng.random() < 0.02:
            yield seed, "seed"
        else:
            yield mutate(seed, rng, pool, mutators)


def check(target: str, data: bytes, workdir: Path, slow_s: float, reference: bool = True) -> list[Finding]:
    """`oracle`'s check of one input for `target` (`reference`: the reference reading is checked even where the
    scanner declines the input)."""
    if target == "envelope":
        return check_body(data, slow_s, reference)
    return check_file(data, workdir, "trace_rank_3.json" if target == "json" else "trace_rank_3", slow_s, reference)


def as_text(result: Result) -> str:
    return json.dumps({"target": result.target, "how": result.how, "bytes": len(result.data),
                       "findings": [(f.kind, f.detail) for f in result.findings]})
