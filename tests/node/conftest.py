"""The `node` fixture: a real one-node cluster (testenv/node.py) that runs pods.

testenv/build (binaries, cached by hash) and testenv/build-images (images, cached by hash) run first;
the first test that uses the fixture gets their cold-build timeout. Tests are skipped only where the
machine cannot run a node (not root, no cgroups) or Go is absent with nothing cached; any other build
or start failure fails them, with the components' logs kept under test-artifacts/node/.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.node.support import CHART_SETS, RELEASE, SYSTEM_NS, chart_from_registry, helm

ROOT = Path(__file__).resolve().parents[2]
TESTENV = ROOT / "testenv"
ARTIFACTS = ROOT / "test-artifacts" / "node"
BUILD_NO_GO = 3
# testenv/build (cold: control plane + node binaries) and testenv/build-images (cold: debootstrap, the
# trainer's torch layer) on 2 cores, with room to spare.
COLD_BUILD_TIMEOUT_S = 80 * 60


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


node_module = _load("frscope_testenv_node", TESTENV / "node.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The first user of each building fixture gets the cold build's time.
    for fixture in ("node", "trainer", "kueue"):
        users = [item for item in items if fixture in getattr(item, "fixturenames", ())]
        if users:
            users[0].add_marker(pytest.mark.timeout(COLD_BUILD_TIMEOUT_S), append=False)


def _last_line(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=COLD_BUILD_TIMEOUT_S, env=env)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, (lines[-1] if lines else ""), proc.stderr


@pytest.fixture(scope="session")
def node(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A running cluster with one node (testenv/node.py's Node): `.kubectl(*args)`, `.kubeconfig`,
    `.plane` (the control plane: `.apply(obj)`, `.kubectl_json(*args)`, `.bin_dir`, `.env()`),
    `.images` and `.ctr(*args)`; images imported: frscope-test/trainer:dev, ...; `.registry` (testenv/registry.py):
    the OCI registry on the node with the frscope image and chart pushed."""
    reason = node_module.cannot_run_reason()
    if reason:
        pytest.skip(f"node: {reason}")
    started = time.monotonic()
    code, bin_dir, err = _last_line([str(TESTENV / "build")])
    if code == BUILD_NO_GO:
        pytest.skip(f"node: testenv/build cannot run: {err.strip()}")
    if code != 0 or not bin_dir:
        pytest.fail(f"testenv/build failed ({code}):\n{err[-4000:]}", pytrace=False)
    env = dict(os.environ)
    venv_pip = Path(sys.executable).parent / "pip"
    if "PIP" not in env and venv_pip.exists():
        env["PIP"] = str(venv_pip)
    code, images_dir, err = _last_line([str(TESTENV / "build-images"), bin_dir], env=env)
    if code != 0 or not images_dir:
        pytest.fail(f"testenv/build-images failed ({code}):\n{err[-4000:]}", pytrace=False)
    code, registry_dir, err = _last_line([str(TESTENV / "build-registry")])
    if code != 0 or not registry_dir:
        pytest.fail(f"testenv/build-registry failed ({code}):\n{err[-4000:]}", pytrace=False)
    built = time.monotonic() - started
    archives = sorted(Path(images_dir).glob("*.tar"))
    crds = sorted((Path(bin_dir).parent / "crds").glob("*.yaml"))
    try:
        cluster = node_module.start(Path(bin_dir), archives, crds=crds,
                                    registry_bin=Path(registry_dir) / "bin" / "registry")
    except node_module.NodeError as e:
        pytest.fail(f"the node did not start: {e}", pytrace=False)
    print(f"node: built in {built:.0f}s, started in {time.monotonic() - started - built:.0f}s; registry pushes "
          f"{cluster.registry.timings}", file=sys.stderr)
    try:
        yield cluster
    finally:
        if request.session.testsfailed > 0:
            kept = cluster.keep_logs(ARTIFACTS)
            print(f"node: logs kept in {kept}", file=sys.stderr)
        problems = cluster.stop()
        assert not problems, f"the node was not cleaned up: {problems}"


@pytest.fixture(scope="session")
def installed(node: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """README's step 1: the chart installed from the node's OCI registry (chart and image pushed there at
    the node's start), its operator Ready; yields helm's home. Once per session: every test that runs
    jobs shares it (uninstalled at the end)."""
    home = tmp_path_factory.mktemp("helm-home")
    args = ["upgrade", "--install", RELEASE, *chart_from_registry(node), "--namespace", SYSTEM_NS,
            "--create-namespace", "--wait", "--timeout", "4m"]
    for s in CHART_SETS:
        args += ["--set", s]
    try:
        helm(node, home, *args, timeout=330)
    except AssertionError:
        print(node.kubectl("-n", SYSTEM_NS, "describe", "pods", check=False).stdout)
        print(node.kubectl("-n", SYSTEM_NS, "logs", "deploy/frscope", "--tail=80", check=False).stdout)
        raise
    yield home
    helm(node, home, "uninstall", RELEASE, "--namespace", SYSTEM_NS, "--wait")


@pytest.fixture(scope="session")
def trainer(node: Any) -> dict[str, str]:
    """Kubeflow Trainer v2 and JobSet running on the node, each in a pod from its own manifests, and
    Trainer's torch-distributed ClusterTrainingRuntime (image: the trainer image built here). Only for
    the tests that ask: building the two controllers is minutes of CPU when Go's cache is cold (the
    e2e `controllers` test builds the same, cached), deploying them about a minute. Returns their
    versions ({"trainer": "v2.3.0", "jobset": "v0.12.0"})."""
    started = time.monotonic()
    code, controllers, err = _last_line([str(TESTENV / "build-controllers")])
    if code == BUILD_NO_GO:
        pytest.skip(f"node: testenv/build-controllers cannot run: {err.strip()}")
    if code != 0 or not controllers:
        pytest.fail(f"testenv/build-controllers failed ({code}):\n{err[-4000:]}", pytrace=False)
    code, manifests, err = _last_line([str(TESTENV / "build-controllers"), "--manifests"])
    if code != 0 or not manifests:
        pytest.fail(f"testenv/build-controllers --manifests failed ({code}):\n{err[-4000:]}", pytrace=False)
    code, images, err = _last_line([str(TESTENV / "build-images"), "--controllers", controllers])
    if code != 0 or not images:
        pytest.fail(f"testenv/build-images --controllers failed ({code}):\n{err[-4000:]}", pytrace=False)
    built = time.monotonic() - started
    node.import_images(sorted(Path(images).glob("*.tar")))
    try:
        versions: dict[str, str] = node_module.deploy_trainer(node, Path(controllers), Path(manifests))
    except node_module.NodeError as e:
        pytest.fail(f"Trainer and JobSet did not start: {e}", pytrace=False)
    print(f"node: Trainer and JobSet built in {built:.0f}s, deployed in {time.monotonic() - started - built:.0f}s",
          file=sys.stderr)
    return versions


@pytest.fixture(scope="module")
def kueue(node: Any, trainer: dict[str, str]) -> Iterator[str]:
    """The Kueue controller manager (testenv/build-kueue) running on the node in a pod from its own
    manifests, with its TrainJob and JobSet integrations, beside Trainer and JobSet; removed after the
    module (its webhooks would otherwise see every TrainJob of the tests after). Yields its version."""
    code, kueue_dir, err = _last_line([str(TESTENV / "build-kueue")])
    if code == BUILD_NO_GO:
        pytest.skip(f"node: testenv/build-kueue cannot run: {err.strip()}")
    if code != 0 or not kueue_dir:
        pytest.fail(f"testenv/build-kueue failed ({code}):\n{err[-4000:]}", pytrace=False)
    code, manifests, err = _last_line([str(TESTENV / "build-kueue"), "--manifests"])
    if code != 0 or not manifests:
        pytest.fail(f"testenv/build-kueue --manifests failed ({code}):\n{err[-4000:]}", pytrace=False)
    code, images, err = _last_line([str(TESTENV / "build-images"), "--kueue", kueue_dir])
    if code != 0 or not images:
        pytest.fail(f"testenv/build-images --kueue failed ({code}):\n{err[-4000:]}", pytrace=False)
    node.import_images(sorted(Path(images).glob("*.tar")))
    try:
        version, applied = node_module.deploy_kueue(node, Path(kueue_dir), Path(manifests))
    except node_module.NodeError as e:
        pytest.fail(f"Kueue did not start: {e}", pytrace=False)
    try:
        yield str(version)
    finally:
        node_module.remove_kueue(node, applied)
