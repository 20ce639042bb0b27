"""The container image's recipe (Dockerfile, .dockerignore), checked statically: there is no container
engine on the test machines. What is checked is what the chart relies on: a numeric non-root USER
(runAsNonRoot), `frscope` as the entry point, and a final stage with no build tools in it."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
COMPILERS = ("gcc", "g++", "clang", "build-essential", "make ", "cc ", "python3-dev", "libc6-dev")


def _stages() -> list[list[str]]:
    """Dockerfile instructions (continuation lines joined), split into stages at FROM."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]
    stages: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(" ".join(line.split()))
    return stages


def test_multi_stage_with_a_slim_python_base() -> None:
    stages = _stages()
    assert len(stages) >= 2
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base.group(1)), base
    assert stages[0][0].endswith(" AS build")
    assert any(i.startswith("COPY --from=build ") for i in stages[-1])


def test_final_stage_has_no_compilers_and_installs_nothing() -> None:
    final = " ".join(_stages()[-1]).lower()
    assert "apt-get install" not in final and "apk add" not in final and "pip install" not in final
    for tool in COMPILERS:
        assert tool not in final, tool
    build = " ".join(_stages()[0])
    # Wheels only: no dependency is compiled, so the build stage needs no compiler either.
    assert "PIP_ONLY_BINARY=:all:" in build


def test_numeric_non_root_user_and_frscope_entry_point() -> None:
    final = _stages()[-1]
    users = [i.split(" ", 1)[1] for i in final if i.startswith("USER ")]
    assert users, "no USER in the final stage"
    assert re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[-1]), users[-1]
    assert users[-1].split(":")[0] == "65532"  # the chart's runAsUser
    assert 'ENTRYPOINT ["frscope"]' in final
    assert any(i.startswith("ENV ") and "PYTHONDONTWRITEBYTECODE=1" in i for i in final)  # read-only root fs


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes; a directory match covers its files."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        if pat.startswith("**/"):
            hit = any(fnmatch.fnmatch(p, pat[3:]) for p in parts)
        else:
            hit = any(fnmatch.fnmatch(p, pat) for p in prefixes)
        if hit:
            ignored = not negate
    return ignored


def test_dockerignore_sends_only_the_package() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for path in ("tests/unit/test_image.py", "docs/install.md", ".git/HEAD", ".venv/bin/python", "bench/README.md",
                 "charts/frscope/Chart.yaml", "testenv/build", "frscope/__pycache__/cli.cpython-311.pyc",
                 "frscope/records/_frscan.cpython-311-x86_64-linux-gnu.so"):
        assert _ignored(path, patterns), path
    for path in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "frscope/cli.py", "frscope/records/_frscan.c",
                 "frscope/report/assets/timeline.js",
                 "frscope/sidecar/bootstrap/sitecustomize.py"):
        assert not _ignored(path, patterns), path
    copied = [src for i in _stages()[0] if i.startswith("COPY ") and "--from" not in i for src in i.split()[1:-1]]
    assert {"pyproject.toml", "setup.py", "README.md", "LICENSE", "frscope"} <= set(copied), copied
    for source in copied:
        assert not _ignored(source.rstrip("/"), patterns), f"the Dockerfile copies {source}, which is ignored"
