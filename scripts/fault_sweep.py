#!/usr/bin/env python3
"""The fault sweep: real torch gloo jobs with injected faults, drawn from a seed; frscope and torchfrtrace
scored on their captures (frscope/testing/sweep).

    scripts/fault_sweep.py run --seed 7 --jobs 40 --out ~/.cache/frscope-sweep/7 [--classes hang,crash]
    scripts/fault_sweep.py score ~/.cache/frscope-sweep/7          # writes results.json there
    scripts/fault_sweep.py report ~/.cache/frscope-sweep/7 --out docs/accuracy.md
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frscope.testing.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
