"""examples/ are ready to apply: each manifest passes the real API server's validation (server-side
dry-run with strict field validation against the PyTorchJob and TrainJob CRDs testenv installs), and
opts its pods in the way docs/install.md says."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def namespace(kube: ControlPlane) -> Iterator[str]:
    name = f"examples-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def _dry_run(kube: ControlPlane, namespace: str, name: str) -> dict[str, object]:
    proc = kube.kubectl("apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-o", "json",
                        "-f", str(EXAMPLES / name))
    stored: dict[str, object] = json.loads(proc.stdout)
    return stored


def test_the_hanging_pytorchjob_is_valid_and_opted_in(kube: ControlPlane, namespace: str) -> None:
    job = _dry_run(kube, namespace, "hanging-pytorchjob.yaml")
    assert job["kind"] == "PyTorchJob"
    specs = job["spec"]["pytorchReplicaSpecs"]  # type: ignore[index]
    assert set(specs) == {"Master", "Worker"}
    for spec in specs.values():
        template = spec["template"]
        assert template["metadata"]["labels"]["frscope.io/inject"] == "true"
        [container] = template["spec"]["containers"]
        assert container["name"] == "pytorch"  # the trainer container the webhook mutates
        assert "dist.all_reduce" in container["command"][-1]


def test_the_hanging_trainjob_is_valid(kube: ControlPlane, namespace: str) -> None:
    job = _dry_run(kube, namespace, "hanging-trainjob.yaml")
    assert job["kind"] == "TrainJob"
    spec = job["spec"]  # type: ignore[index]
    assert spec["runtimeRef"]["name"] == "torch-distributed"
    assert spec["trainer"]["numNodes"] == 2
    assert "torchrun" in spec["trainer"]["command"][-1]
    # Trainer v2.2+ API: the opt-in label on the `node` job's pod template, through runtimePatches.
    [patch] = spec["runtimePatches"]
    [rjob] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    assert rjob["template"]["spec"]["template"]["metadata"]["labels"]["frscope.io/inject"] == "true"


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == ["hanging-pytorchjob.yaml", "hanging-trainjob.yaml"]
