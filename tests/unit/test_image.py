"""The container image's recipe (Dockerfile, .dockerignore, requirements/), checked statically here; the node
tier builds it (testenv/build-images) and checks that its Python reads dumps with the C scanner. What is
checked is what the chart relies on: a numeric non-root USER (runAsNonRoot), `frscope` as the entry point, a
final stage with no build tools in it, and every installed file pinned and hash-checked."""

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


def test_multi_stage_build_then_install_then_a_slim_final_stage() -> None:
    stages = _stages()
    assert len(stages) == 3
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base.group(1)), base
    # The build stage compiles the scanner with the same Python (the full image: gcc and headers).
    builder = re.search(r"^ARG BUILDER_IMAGE=(\S+)$", text, re.M)
    assert builder and builder.group(1) == base.group(1).replace("-slim", ""), builder
    assert stages[0][0] == "FROM ${BUILDER_IMAGE} AS build"
    assert stages[1][0] == "FROM ${PYTHON_IMAGE} AS install"
    assert stages[2][0] == "FROM ${PYTHON_IMAGE}"
    assert any(i.startswith("COPY --from=build /dist ") for i in stages[1])
    assert any(i.startswith("COPY --from=install /opt/frscope ") for i in stages[2])


def test_final_stage_has_no_compilers_and_installs_nothing() -> None:
    final = " ".join(_stages()[-1]).lower()
    assert "apt-get install" not in final and "apk add" not in final and "pip install" not in final
    for tool in COMPILERS:
        assert tool not in final, tool


def test_every_install_is_pinned_and_hash_checked() -> None:
    build, install, _ = _stages()
    installs = [i for stage in (build, install) for i in stage if "pip install" in i]
    assert len(installs) == 3, installs
    for instruction in installs:
        for command in instruction.split("&&"):
            if "pip install" in command:
                assert "--require-hashes -r " in command, command
    assert "--only-binary=:all: --require-hashes -r /tmp/requirements/image.txt" in " ".join(install)
    assert "--no-deps --require-hashes -r /dist/frscope.txt" in " ".join(install)
    # frscope.txt names the wheel the build stage made, with its sha256; the wheel must hold the scanner.
    assert "--hash=sha256:" in " ".join(build) and "_frscan." in " ".join(build)
    assert "pip wheel --no-deps --no-build-isolation" in " ".join(build)
    # The environment is checked before it is copied: the pins satisfy the wheel, the scanner is in.
    joined = " ".join(install)
    assert "pip check" in joined and "import frscope.records._frscan" in joined
    assert "(dump reader: C scanner)" in joined


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
    for path in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "requirements/image.txt",
                 "requirements/build.txt", "frscope/cli.py", "frscope/records/_frscan.c",
                 "frscope/report/assets/timeline.js",
                 "frscope/sidecar/bootstrap/sitecustomize.py"):
        assert not _ignored(path, patterns), path
    copied = [src for stage in _stages() for i in stage if i.startswith("COPY ") and "--from" not in i
              for src in i.split()[1:-1]]
    assert {"pyproject.toml", "setup.py", "README.md", "LICENSE", "frscope", "requirements/build.txt",
            "requirements/image.txt"} <= set(copied), copied
    for source in copied:
        assert not _ignored(source.rstrip("/"), patterns), f"the Dockerfile copies {source}, which is ignored"
