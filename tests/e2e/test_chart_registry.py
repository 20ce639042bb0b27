"""The chart as a release publishes it: `helm push`ed to a real OCI registry (the CNCF registry that
testenv/build-registry builds, on loopback, TLS with a private CA, as docs/install.md's "From an OCI
registry" describes) and installed from `oci://` into the real API server; a client that does not
trust the CA is refused. The node tier (tests/node) also has the kubelet pull the image from such a
registry and runs `helm test`."""

from __future__ import annotations

import importlib.util
import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.chart_tools import CHART, Helm
except ModuleNotFoundError:
    from chart_tools import CHART, Helm

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TESTENV = Path(__file__).resolve().parents[2] / "testenv"


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


cluster = _load("frscope_testenv_cluster", TESTENV / "cluster.py")
oci = _load("frscope_testenv_registry", TESTENV / "registry.py")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The registry on 127.0.0.1 (a free port), TLS with a CA of its own, storage in a temporary dir."""
    built = subprocess.run([str(TESTENV / "build-registry"), "--check"], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.skip("the registry is not built yet: testenv/build-registry (make registry)")
    binary = Path(built.stdout.strip().splitlines()[-1]) / "bin" / "registry"
    work = tmp_path_factory.mktemp("registry")
    processes: list[Any] = []

    def spawn(name: str, args: list[str], env: dict[str, str]) -> Any:
        log_path = work / f"{name}.log"
        log = log_path.open("ab")
        popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        processes.append(cluster._Process(name, popen, log_path, log))
        return processes[-1]

    reg, _ = oci.prepare(cluster, work, "127.0.0.1", cluster.free_port())
    try:
        oci.start(reg, cluster, spawn, binary, 30)
        yield reg
    finally:
        for p in processes:
            cluster._terminate(p.popen, grace=5)
            p.log_file.close()


def test_the_chart_installs_from_an_oci_registry_whose_ca_helm_is_given(
    kube: ControlPlane, registry: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    helm = Helm(kube.bin_dir / "helm", tmp_path_factory.mktemp("helm-home"), kube.kubeconfig)
    oci.push_chart(registry, helm.binary, CHART)
    version = oci.chart_field(CHART, "version")
    assert registry.chart_version == version and registry.chart_digest.startswith("sha256:")

    # A client that does not trust the registry's CA is refused, with the reason.
    refused = helm.run("show", "chart", registry.chart_ref, "--version", version, check=False)
    assert refused.returncode != 0 and "certificate signed by unknown authority" in refused.stderr, refused.stderr
    shown = helm.run("show", "chart", registry.chart_ref, "--version", version, "--ca-file", str(registry.ca_file))
    assert f"version: {version}" in shown.stdout

    suffix = secrets.token_hex(3)
    namespace = f"frscope-oci-{suffix}"
    release = f"frs{suffix}"
    kube.kubectl("create", "namespace", namespace)
    try:
        out = helm.run("install", release, registry.chart_ref, "--version", version, "--ca-file", str(registry.ca_file),
                       "--namespace", namespace, "--set", "image.repository=registry.example.com/frscope/frscope",
                       timeout=180).stdout
        assert "STATUS: deployed" in out, out
        [listed] = json.loads(helm.run("list", "--namespace", namespace, "-o", "json").stdout)
        assert listed["chart"] == f"frscope-{version}" and listed["status"] == "deployed", listed
        deploy = kube.kubectl_json("-n", namespace, "get", "deployment", f"{release}-frscope")
        image = deploy["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == f"registry.example.com/frscope/frscope:{oci.chart_field(CHART, 'appVersion')}"
        # `helm test`'s pod is a hook: `helm install` does not create it.
        assert not kube.kubectl_json("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=test")["items"]
    finally:
        helm.run("uninstall", release, "--namespace", namespace, check=False)
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
