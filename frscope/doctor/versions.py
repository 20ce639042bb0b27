"""The versions frscope is tested with: the one table `frscope doctor` and README.md's table follow.

Only what a test runs is listed (README.md names each test). A server outside the table may work;
doctor passes a minor between two tested ones, and says one outside them is untested rather than broken.
"""

from __future__ import annotations

from typing import Final

# Kubernetes minor versions whose API server the e2e tier runs (testenv: 1.36 also on the node tier;
# 1.30 and 1.33 in the version matrix, tests/e2e/test_kube_versions*.py).
TESTED_KUBERNETES: Final = frozenset({(1, 30), (1, 33), (1, 36)})


def kubernetes_tested(version: tuple[int, int]) -> bool:
    return version in TESTED_KUBERNETES


def kubernetes_between_tested(version: tuple[int, int]) -> bool:
    """Between the oldest and the newest tested minor: the chart and the APIs it uses are the same on both
    ends (every API frscope calls is GA from the oldest on), so a minor in between is supported too."""
    return min(TESTED_KUBERNETES) <= version <= max(TESTED_KUBERNETES)


def tested_text() -> str:
    return ", ".join(f"{a}.{b}" for a, b in sorted(TESTED_KUBERNETES))
