"""`pip install frscope` for the CLI's users: the sdist and the manylinux wheel that scripts/build-dist makes
(the release workflow builds the same with cibuildwheel for x86_64 and aarch64; there is no container engine
here for cibuildwheel, so this is the same build on this machine's glibc, repaired by auditwheel), installed
into a fresh virtual environment (no checkout on its path, no editable install, no compiler: binary packages
only), carry the C scanner and run the CLI on real recorder dumps with it.

scripts/build-dist and the fresh environment are cached by the hash of their inputs (the sources, the built
wheel): a warm run only runs the checks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "data" / "real"
CACHE = Path(os.environ.get("FRSCOPE_TESTENV_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "frscope-testenv")
# A hang on real gloo dumps (torch 2.13, pickle): the diagnosis names rank 1.
DUMPS = REAL / "crossgroup-pickle"
# A fresh venv of an older wheel is removed once unused this long (other worktrees may still use theirs).
STALE_VENV_S = 6 * 3600


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]


def _clean_env(**extra: str) -> dict[str, str]:
    """No checkout on the path, no compiler: what a CLI user's shell has after `pip install frscope`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "FRSCOPE_"))}
    env.update(CC="/bin/false", CXX="/bin/false", **extra)
    return env


@pytest.fixture(scope="module")
def tools() -> Path:
    done = _run([str(ROOT / "scripts" / "dist-tools")], cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dist() -> Path:
    done = _run([str(ROOT / "scripts" / "build-dist")], cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    wheels = sorted(dist.glob("frscope-*-manylinux*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel: Path) -> Path:
    """A fresh venv with only the wheel (and its dependencies, as binaries from PyPI or pip's cache)."""
    digest = subprocess.run(["sha256sum", str(wheel)], capture_output=True, text=True, check=True).stdout[:16]
    dest = CACHE / f"wheel-venv-{digest}-py{sys.version_info[0]}{sys.version_info[1]}"
    if not (dest / "complete").exists():
        shutil.rmtree(dest, ignore_errors=True)
        made = _run([sys.executable, "-m", "venv", str(dest)], env=_clean_env())
        assert made.returncode == 0, made.stderr
        installed = _run([str(dest / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                          "--only-binary=:all:", str(wheel)], cwd=dest, env=_clean_env())
        assert installed.returncode == 0, installed.stderr[-4000:]
        (dest / "complete").touch()
    os.utime(dest)
    for old in CACHE.glob("wheel-venv-*"):
        if old != dest and time.time() - old.stat().st_mtime > STALE_VENV_S:
            shutil.rmtree(old, ignore_errors=True)
    return dest


def test_sdist_carries_the_scanner_sources_setup_and_license(dist: Path) -> None:
    (sdist,) = dist.glob("frscope-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
        pkg_info = tar.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/PKG-INFO")
        assert pkg_info is not None
        metadata = pkg_info.read().decode()
    for needed in ("pyproject.toml", "setup.py", "LICENSE", "README.md", "frscope/records/_frscan.c",
                   "frscope/records/_frscan_json.c", "frscope/records/_frscan_groups.c",
                   "frscope/records/_frscan_fields.h", "frscope/records/_frscan_arena.h",
                   "frscope/report/assets/timeline.js", "frscope/py.typed"):
        assert needed in names, needed
    assert not any(name.startswith("tests/") or name.endswith(".so") for name in names)
    assert "License-Expression: Apache-2.0" in metadata


def test_wheel_is_manylinux_and_carries_the_built_scanner(wheel: Path) -> None:
    assert wheel.name.startswith(f"frscope-0.1.0-cp{sys.version_info[0]}{sys.version_info[1]}-")
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert [n for n in names if n.startswith("frscope/records/_frscan.") and n.endswith(".so")], names
    assert not [n for n in names if n.endswith((".c", ".h"))]  # sources stay in the sdist
    assert "License-Expression: Apache-2.0" in metadata
    # The analyzer alone by default; the cluster parts and the demo are extras.
    requires = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    assert [r for r in requires if "extra ==" not in r] == ["tqdm>=4.66.3"], requires
    assert any(r.startswith("kopf") and 'extra == "cluster"' in r for r in requires), requires
    assert any(r.startswith("frscope[cluster]") and 'extra == "demo"' in r for r in requires), requires
    # PyPI shows these links as they are: absolute, never relative to a checkout.
    urls = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Project-URL: ")]
    assert {u.split(", ", 1)[0] for u in urls} >= {"Homepage", "Source", "Issues", "Changelog"}, urls
    assert all(u.split(", ", 1)[1].startswith("https://github.com/frscope/frscope") for u in urls), urls
    # The page itself (README.md): every link absolute, the screenshot from raw content.
    description = metadata.split("\n\n", 1)[1]
    assert "Content-Type: text/markdown" in metadata and description.startswith("# frscope")
    links = re.findall(r"\]\(([^)\s]*)\)", description)
    assert len(links) >= 10 and all(link.startswith("https://") for link in links), links
    assert "https://raw.githubusercontent.com/frscope/frscope/main/docs/images/live-window.png" in links


def test_installed_wheel_imports_its_own_scanner(venv: Path, tmp_path: Path) -> None:
    python = str(venv / "bin" / "python")
    done = _run([python, "-c", "import frscope, frscope.records._frscan as m; print(frscope.__file__); "
                 "print(m.__file__)"], cwd=tmp_path, env=_clean_env())
    assert done.returncode == 0, done.stderr
    package, module = done.stdout.split()
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                env=_clean_env()).stdout.strip()
    assert Path(package).is_relative_to(site) and Path(module).is_relative_to(site), (package, module, site)


def test_cli_from_the_wheel_diagnoses_real_dumps_with_the_scanner(venv: Path, tmp_path: Path) -> None:
    frscope = str(venv / "bin" / "frscope")
    version = _run([frscope, "--version"], cwd=tmp_path, env=_clean_env())
    assert version.stdout.strip() == "frscope 0.1.0 (dump reader: C scanner)", version

    # The scanner takes every one of these dumps (None would mean: read the reference way).
    probe = ("import sys; from pathlib import Path; from frscope.records import scan; "
             "from frscope.records.model import LazyFrames; "
             "from frscope.records.normalize import parse_profiling_name; "
             "print(sum(scan.scan_dump(p.read_bytes(), LazyFrames(list), parse_profiling_name) is not None "
             "for p in sorted(Path(sys.argv[1]).iterdir())))")
    scanned = _run([str(venv / "bin" / "python"), "-c", probe, str(DUMPS)], cwd=tmp_path, env=_clean_env())
    assert scanned.returncode == 0, scanned.stderr
    assert int(scanned.stdout) == len(list(DUMPS.iterdir())) == 4

    fast = _run([frscope, "analyze", "--format", "json", str(DUMPS)], cwd=tmp_path, env=_clean_env())
    assert fast.returncode == 1, fast.stderr  # 1: findings
    report = json.loads(fast.stdout)
    assert report["findings"][0]["culprit_ranks"] == [1], report["findings"][0]
    # The pure-Python reader in the same install says exactly the same.
    pure = _run([frscope, "analyze", "--format", "json", str(DUMPS)], cwd=tmp_path,
                env=_clean_env(FRSCOPE_NO_SCANNER="1"))
    assert pure.returncode == 1 and json.loads(pure.stdout) == report


# What `pip install frscope` must not bring: the cluster extra's packages (and what only they pull in), torch.
CLUSTER_ONLY = ("kopf", "aiohttp", "cryptography", "prometheus-client", "prometheus_client", "pyjwt", "pyyaml",
                "kubernetes", "torch", "yarl", "multidict")


def test_the_analyzer_installs_alone_and_works(venv: Path, tmp_path: Path) -> None:
    """The wheel's venv holds the analyzer and nothing of the cluster parts; `frscope analyze` diagnoses real
    dumps there, the cluster commands say which extra to install, the demo how to get torch."""
    listed = _run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json",
                   "--disable-pip-version-check"], env=_clean_env())
    assert listed.returncode == 0, listed.stderr
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert not installed & set(CLUSTER_ONLY), sorted(installed)
    assert {"frscope", "tqdm"} <= installed, sorted(installed)
    frscope = str(venv / "bin" / "frscope")
    done = _run([frscope, "analyze", str(DUMPS)], cwd=tmp_path, env=_clean_env())
    assert done.returncode == 1 and "rank 1" in done.stdout.lower().split("\n")[0], done
    for command in ("operator", "sidecar", "doctor"):
        done = _run([frscope, command, "--help"], cwd=tmp_path, env=_clean_env())
        assert done.returncode == 2 and "pip install 'frscope[cluster]'" in done.stderr, done
        assert "Traceback" not in done.stderr
    done = _run([frscope, "demo"], cwd=tmp_path, env=_clean_env())
    assert done.returncode == 2 and "-m pip install 'frscope[demo]'" in done.stderr and "Traceback" not in done.stderr


def test_release_wheels_are_the_manylinux_builds_for_both_arches(tools: Path) -> None:
    """The release workflow's cibuildwheel, same version, reads pyproject.toml's [tool.cibuildwheel] (it cannot
    build here: no container engine it drives)."""
    workflow = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    installed = _run([str(tools / "python"), "-m", "pip", "show", "cibuildwheel"], env=_clean_env()).stdout
    version = next(line.split()[1] for line in installed.splitlines() if line.startswith("Version:"))
    assert f"pypa/cibuildwheel@v{version}" in workflow
    listed = _run([str(tools / "cibuildwheel"), "--print-build-identifiers", "--platform", "linux",
                   "--archs", "x86_64,aarch64", str(ROOT)], cwd=ROOT, env=_clean_env())
    assert listed.returncode == 0, listed.stderr
    assert set(listed.stdout.split()) == {f"cp3{minor}-manylinux_{arch}" for minor in (11, 12, 13)
                                          for arch in ("x86_64", "aarch64")}
