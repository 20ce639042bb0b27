"""Which Python runs a given torch minor version in the tests: the test venv's own for 2.13, a cached
venv from scripts/torch-venv for the others (`make torch-venvs` builds TORCH_VERSIONS). A version whose
venv is missing skips the test, naming the command that builds it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OWN_MINOR = "2.13"  # the test venv's torch (pyproject.toml)
OTHER_VERSIONS = {"2.14": "2.14.1", "2.15": "2.15.0"}  # minor -> the release its venv holds
MINORS = [OWN_MINOR, *OTHER_VERSIONS]


def python_for(minor: str) -> str:
    if minor == OWN_MINOR:
        return sys.executable
    release = OTHER_VERSIONS[minor]
    done = subprocess.run([str(REPO / "scripts" / "torch-venv"), "--check", release],
                          capture_output=True, text=True, timeout=30)
    if done.returncode == 3:
        pytest.skip(f"no venv for torch {release}: scripts/torch-venv {release}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
