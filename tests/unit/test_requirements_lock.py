"""requirements/*.txt, the pinned and hash-checked files the image installs (Dockerfile, scripts/lock-deps):
each pin carries hashes, and the pins still satisfy pyproject.toml (a dependency added or narrowed there
without re-running scripts/lock-deps fails here, not in the image build's `pip check`)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins(name: str) -> dict[str, tuple[str, list[str]]]:
    """{canonical name: (pinned version, its sha256 hashes)} of requirements/<name>."""
    text = (ROOT / "requirements" / name).read_text().replace("\\\n", " ")
    pins: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})\b", line)
        requirement = Requirement(re.sub(r"\s--hash=\S+", "", line).strip())
        (spec,) = requirement.specifier
        assert spec.operator == "==", line
        pins[canonicalize_name(requirement.name)] = (spec.version, hashes)
    return pins


@pytest.mark.parametrize("name", ["image.txt", "build.txt"])
def test_every_pin_has_hashes(name: str) -> None:
    pins = _pins(name)
    assert pins
    for package, (_, hashes) in pins.items():
        assert hashes, f"{name}: {package} has no --hash"


def test_image_pins_satisfy_the_runtime_dependencies() -> None:
    """The image runs the sidecar and the operator: frscope's dependencies and its cluster extra."""
    pins = _pins("image.txt")
    for line in PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["cluster"]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is a dependency but not in requirements/image.txt: run scripts/lock-deps"
        assert requirement.specifier.contains(pins[name][0]), f"{name}=={pins[name][0]} is not {requirement}"
    assert "torch" not in pins and "pytest" not in pins  # extras stay out of the image


def test_build_pins_satisfy_the_build_system() -> None:
    pins = _pins("build.txt")
    for line in PYPROJECT["build-system"]["requires"]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins and requirement.specifier.contains(pins[name][0]), (requirement, pins)
