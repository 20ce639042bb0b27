"""The CRD schema hash that lets `frscope doctor` tell a stale served CRD after `helm upgrade` (Helm never
upgrades crds/): each file in charts/frscope/crds/ carries the hash of its own spec, and frscope knows the
same hashes. Editing a CRD's schema without updating both fails here, naming the new value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from frscope.doctor.crd_schema import ANNOTATION, SHIPPED, schema_hash, stale_schema

# frscope's own CRDs (group frscope.io): a CRD of another group in crds/ would be left alone by doctor.
CRDS = sorted(p for p in (Path(__file__).resolve().parents[2] / "charts" / "frscope" / "crds").glob("*.yaml")
              if yaml.safe_load(p.read_text())["spec"]["group"] == "frscope.io")


@pytest.mark.parametrize("path", CRDS, ids=lambda p: p.name)
def test_each_shipped_crd_carries_its_own_schema_hash_and_frscope_knows_it(path: Path) -> None:
    crd = yaml.safe_load(path.read_text())
    name, actual = crd["metadata"]["name"], schema_hash(crd["spec"])
    assert crd["metadata"].get("annotations", {}).get(ANNOTATION) == actual, (
        f"{path}: set metadata.annotations[{ANNOTATION!r}] to {actual!r}")
    assert SHIPPED.get(name) == actual, f"frscope/doctor/crd_schema.py SHIPPED[{name!r}] must be {actual!r}"
    assert stale_schema(crd) is None


def test_every_frscope_crd_is_shipped() -> None:
    assert CRDS
    assert {yaml.safe_load(p.read_text())["metadata"]["name"] for p in CRDS} == set(SHIPPED)


def _served(annotations: dict[str, str] | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "flightrecorderreports.frscope.io"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": {"versions": []}}


def test_an_older_or_unannotated_schema_is_stale() -> None:
    assert "serves schema 'deadbeefdeadbeef'" in (stale_schema(_served({ANNOTATION: "deadbeefdeadbeef"})) or "")
    assert "no frscope.io/schema-hash annotation" in (stale_schema(_served(None)) or "")
    assert stale_schema(_served({ANNOTATION: SHIPPED["flightrecorderreports.frscope.io"]})) is None
    assert stale_schema({"metadata": {"name": "other.example.com"}}) is None  # not frscope's: not judged here


def test_a_schema_change_changes_the_hash() -> None:
    spec = yaml.safe_load(CRDS[0].read_text())["spec"]
    before = schema_hash(spec)
    spec["versions"][0]["schema"]["openAPIV3Schema"].setdefault("properties", {})["newField"] = {"type": "string"}
    assert schema_hash(spec) != before
