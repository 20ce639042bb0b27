"""The `kube` fixture: a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager)
built from the Go module proxy by testenv/build and started on loopback by testenv/cluster.py.

`make test` runs `make testenv` first, so pytest only reuses the cached binaries. When pytest is run
on its own with a cold cache, the first test that uses `kube` gets a long timeout for the build.
The e2e tests are skipped only when the build cannot run at all because Go is not installed (and
nothing is cached); any other build or start failure fails them loudly.

The Kubernetes version matrix (tests/e2e/kube_matrix.py): a test parametrized indirectly with
`kube_release` (session scope) gets the control plane of that release; `kube` is the default release's.
A release that is neither the default nor, under CI=true, the oldest is skipped when its binaries are
not built (`testenv/build --version X`, `make test-kube-matrix`).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e import kube_matrix
except ModuleNotFoundError:
    import kube_matrix

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


def _version_args(version: str | None) -> list[str]:
    return [] if version is None or version == kube_matrix.default_release() else ["--version", version]


def _cached_bin_dir(version: str | None = None) -> Path | None:
    proc = subprocess.run([str(TESTENV / "build"), *_version_args(version), "--check"], capture_output=True,
                          text=True, check=False, timeout=60)
    return Path(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None


def _release_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("kube_release") if callspec is not None else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A session fixture is set up inside the first user's timeout: when it has to build, give that
    # user the build's timeout.
    users = [item for item in items if "kube" in getattr(item, "fixturenames", ()) and _release_of(item) is None]
    if users and _cached_bin_dir() is None:
        users[0].add_marker(pytest.mark.timeout(COLD_BUILD_TIMEOUT_S), append=False)
    first_of: dict[str, pytest.Item] = {}
    for item in items:
        release = _release_of(item)
        if release is not None and release not in first_of:
            first_of[release] = item
    for release, item in first_of.items():
        if kube_matrix.must_be_built(release) and _cached_bin_dir(release) is None:
            item.add_marker(pytest.mark.timeout(COLD_BUILD_TIMEOUT_S), append=False)


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


def build_testenv(config: pytest.Config, version: str | None = None) -> Path:
    """Run testenv/build [--version VERSION] (a no-op when cached); skip if Go is absent, fail on anything else."""
    started = time.monotonic()
    proc = subprocess.run(
        [str(TESTENV / "build"), *_version_args(version)],
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
        pytest.fail(f"testenv/build {' '.join(_version_args(version))} failed with exit status "
                    f"{proc.returncode}:\n{tail}", pytrace=False)
    bin_dir = Path(proc.stdout.strip().splitlines()[-1])
    if time.monotonic() - started > 10:
        _report(config, f"e2e: testenv/build took {time.monotonic() - started:.0f}s:\n{proc.stderr}")
    return bin_dir


@pytest.fixture(scope="session")
def testenv_bin_dir(pytestconfig: pytest.Config) -> Path:
    return build_testenv(pytestconfig)


@contextmanager
def _running_plane(request: pytest.FixtureRequest, bin_dir: Path) -> Iterator[ControlPlane]:
    crd_dir = bin_dir.parent / "crds"
    crds = sorted(crd_dir.glob("*.yaml"))
    if not any(c.name == "kubeflow.org_pytorchjobs.yaml" for c in crds):
        pytest.fail(f"no PyTorchJob CRD in {crd_dir}; testenv/build did not finish", pytrace=False)
    try:
        plane: ControlPlane = cluster.start(bin_dir, crds=crds)
    except cluster.ControlPlaneError as e:
        pytest.fail(f"the control plane ({bin_dir}) did not start: {e}", pytrace=False)
    try:
        yield plane
    finally:
        failed = request.session.testsfailed > 0
        kept = plane.stop(keep_logs_in=ARTIFACTS if failed else None)
        if kept is not None:
            _report(request.config, f"e2e: control plane logs kept in {kept}")


@pytest.fixture(scope="session")
def default_control_plane(request: pytest.FixtureRequest, testenv_bin_dir: Path) -> Iterator[ControlPlane]:
    """The default release's control plane; tests use it as `kube` (a separate name, so that a module
    that overrides `kube`, like the version matrix, can still reach it)."""
    with _running_plane(request, testenv_bin_dir) as plane:
        yield plane


@pytest.fixture(scope="session")
def kube(default_control_plane: ControlPlane) -> ControlPlane:
    """A running control plane with the PyTorchJob (and TrainJob) CRDs installed.

    Attributes: .kubeconfig, .server, .bin_dir, .ca_file, .admin_token, .kubectl(*args),
    .kubectl_json(*args), .apply(obj), .get_raw(path), .env(). See testenv/cluster.py.
    """
    return default_control_plane


@pytest.fixture(scope="session")
def kube_release(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """The control plane of the release a test is parametrized with (indirectly, session scope, from
    kube_matrix.other_releases()); the default release's is `kube`. One release's plane runs at a time."""
    version: str = request.param
    if version == kube_matrix.default_release():
        yield request.getfixturevalue("default_control_plane")
        return
    bin_dir = _cached_bin_dir(version)
    if bin_dir is None:
        if not kube_matrix.must_be_built(version):
            reason = (f"Kubernetes {version}: its control plane is not built (testenv/build --version {version}, "
                      "or `make test-kube-matrix` for every release)")
            _report(request.config, f"e2e: {reason}")
            pytest.skip(reason)
        bin_dir = build_testenv(request.config, version)
    with _running_plane(request, bin_dir) as plane:
        yield plane
