"""The GitHub workflows (.github/workflows): actionlint (built from its Go module by testenv/build-actionlint,
cached) finds nothing, shellcheck included for their `run:` scripts; and the release workflow does what
docs/release.md promises: on a version tag, the multi-arch image, the chart to an OCI registry, the sdist and
the manylinux wheels for both architectures to PyPI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def _actionlint() -> str:
    done = subprocess.run([str(ROOT / "testenv" / "build-actionlint")], capture_output=True, text=True, check=False)
    if done.returncode == 3 and os.environ.get("CI") != "true":
        pytest.skip(f"Go is not installed: actionlint cannot be built ({done.stderr.strip()})")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _workflow(name: str) -> dict[Any, Any]:
    loaded = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(loaded, dict)
    return loaded


def _steps(job: dict[str, Any]) -> str:
    """A job's steps as text: `uses`, `with` and `run` of each, to look for what the job does."""
    return "\n".join(yaml.safe_dump(step, width=10_000) for step in job["steps"])


def test_actionlint_finds_nothing() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None and os.environ.get("CI") == "true":
        pytest.fail("shellcheck is not installed (make deps-apt): actionlint would skip the run: scripts")
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert {"ci.yml", "release.yml"} <= {Path(f).name for f in files}
    done = subprocess.run([_actionlint(), "-no-color", f"-shellcheck={shellcheck or ''}", *files],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_release_runs_on_version_tags_and_checks_them() -> None:
    release = _workflow("release.yml")
    on = release[True]  # YAML 1.1 reads the key `on` as true
    assert set(on) == {"push"} and on["push"]["tags"] == ["v*.*.*"]
    assert release["permissions"] == {"contents": "read"}  # jobs widen it only where they push
    version_check = _steps(release["jobs"]["version"])
    assert "pyproject.toml" in version_check and "Chart.yaml" in version_check and "appVersion" in version_check


def test_release_pushes_the_multi_arch_image_and_the_chart() -> None:
    jobs = _workflow("release.yml")["jobs"]
    image = _steps(jobs["image"])
    assert "docker/build-push-action@" in image and "platforms: linux/amd64,linux/arm64" in image
    assert "push: true" in image and "(dump reader: C scanner)" in image
    assert jobs["image"]["permissions"]["packages"] == "write"
    chart = _steps(jobs["chart"])
    assert re.search(r"helm push \S+ \"oci://ghcr\.io/", chart), chart
    assert "helm package charts/frscope" in chart and "image" in jobs["chart"]["needs"]


def test_release_builds_wheels_for_both_arches_and_publishes_to_pypi() -> None:
    release = _workflow("release.yml")
    jobs = release["jobs"]
    arches = {entry["arch"] for entry in jobs["wheels"]["strategy"]["matrix"]["include"]}
    assert arches == {"x86_64", "aarch64"}
    assert "pypa/cibuildwheel@" in _steps(jobs["wheels"])
    assert "--sdist" in _steps(jobs["sdist"])
    assert set(jobs["pypi"]["needs"]) == {"wheels", "sdist"}
    assert "pypa/gh-action-pypi-publish@" in _steps(jobs["pypi"]) and jobs["pypi"]["permissions"] == {
        "id-token": "write"}
    # The chart goes out with the helm that the tests install it with (testenv/helm/go.mod).
    tested = re.search(r"^\thelm\.sh/helm/v3 (v\S+)", (ROOT / "testenv/helm/go.mod").read_text(), re.M)
    assert tested and release["env"]["HELM_VERSION"] == tested.group(1)
