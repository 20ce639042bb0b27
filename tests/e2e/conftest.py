"""The `kube` fixture: a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager)
built from the Go module proxy by testenv/build and started on loopback by testenv/cluster.py.

`make test` runs `make testenv` first, so pytest only reuses the cached binaries. When pytest is run
on its own with a cold cache, the first test that uses `kube` gets a long timeout for the build.
The e2e tests are skipped only when the build cannot run at all because Go is not installed (and
nothing is cached); any other build or start failure fails them loudly.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
TESTENV = ROOT / "testenv"
ARTIFACTS = ROOT / "test-artifacts" / "e2e"
# Exit status of testenv/build when Go is absent and nothing is cached.
BUILD_NO_GO = 3
# A cold build (all five binaries) on 2 cores, with room to spare.
COLD_BUILD_TIMEOUT_S = 80 * 60


def _load_cluster() -> ModuleType:
    name = "frscope_testenv_cluster"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TESTENV / "cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


cluster = _load_cluster()


def _cached_bin_dir() -> Path | None:
    proc = subprocess.run([str(TESTENV / "build"), "--check"], capture_output=True, text=True, check=False, timeout=60)
    return Path(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    users = [item for item in items if "kube" in getattr(item, "fixturenames", ())]
    if users and _cached_bin_dir() is None:
        # The session fixture is set up inside the first user's timeout: give it the build's.
        users[0].add_marker(pytest.mark.timeout(COLD_BUILD_TIMEOUT_S), append=False)


# Lines for the end of the run (skip reason, where the logs were kept): output of a session fixture's
# teardown is captured with the last test's, which hides it when that test passed.
_SUMMARY: list[str] = []


def _report(config: pytest.Config, line: str) -> None:
    if line not in _SUMMARY:
        _SUMMARY.append(line)
    print(line, file=sys.stderr)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _SUMMARY:
        terminalreporter.write_line(line)


def build_testenv(config: pytest.Config) -> Path:
    """Run testenv/build (a no-op when cached); skip if Go is absent, fail on anything else."""
    started = time.monotonic()
    proc = subprocess.run(
        [str(TESTENV / "build")],
        capture_output=True,
        text=True,
        check=False,
        timeout=COLD_BUILD_TIMEOUT_S,
    )
    if proc.returncode == BUILD_NO_GO:
        reason = f"e2e: testenv/build cannot run: {proc.stderr.strip()}"
        _report(config, reason)
        pytest.skip(reason)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = "\n".join(proc.stderr.splitlines()[-60:])
        pytest.fail(f"testenv/build failed with exit status {proc.returncode}:\n{tail}", pytrace=False)
    bin_dir = Path(proc.stdout.strip().splitlines()[-1])
    if time.monotonic() - started > 10:
        _report(config, f"e2e: testenv/build took {time.monotonic() - started:.0f}s:\n{proc.stderr}")
    return bin_dir


@pytest.fixture(scope="session")
def testenv_bin_dir(pytestconfig: pytest.Config) -> Path:
    return build_testenv(pytestconfig)


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest, testenv_bin_dir: Path) -> Iterator[ControlPlane]:
    """A running control plane with the PyTorchJob (and TrainJob) CRDs installed.

    Attributes: .kubeconfig, .server, .bin_dir, .ca_file, .admin_token, .kubectl(*args),
    .kubectl_json(*args), .apply(obj), .get_raw(path), .env(). See testenv/cluster.py.
    """
    crd_dir = testenv_bin_dir.parent / "crds"
    crds = sorted(crd_dir.glob("*.yaml"))
    if not any(c.name == "kubeflow.org_pytorchjobs.yaml" for c in crds):
        pytest.fail(f"no PyTorchJob CRD in {crd_dir}; testenv/build did not finish", pytrace=False)
    try:
        plane: ControlPlane = cluster.start(testenv_bin_dir, crds=crds)
    except cluster.ControlPlaneError as e:
        pytest.fail(f"the control plane did not start: {e}", pytrace=False)
    try:
        yield plane
    finally:
        failed = request.session.testsfailed > 0
        kept = plane.stop(keep_logs_in=ARTIFACTS if failed else None)
        if kept is not None:
            _report(request.config, f"e2e: control plane logs kept in {kept}")
