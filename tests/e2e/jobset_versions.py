"""The JobSet releases the API-server tier runs its controller tests against, and the real controllers
(JobSet, Kubeflow Trainer) out of cluster against the test API server.

The default JobSet is the one Trainer v2.3.0 requires (testenv/controllers/go.mod, built with Trainer by
`testenv/build-controllers`); every other release has a module of its own, testenv/jobset/<version>/go.mod,
built alone by `testenv/build-controllers --jobset <version>`. A test parametrized indirectly with
`jobset_controller` (tests/e2e/test_trainjob_e2e.py) gets that release's CRD on the API server and its
controller running; the default release's CRD is put back afterwards, so the other tests of the session
see the CRD they were written for.

The JobSet webhooks (defaulting and validation of JobSets, not of pods) can be registered with the API
server by URL, for the namespaces labelled WEBHOOK_LABEL only: a JobSet that the Trainer controller
creates carries none of the defaults the JobSet controller relies on (successPolicy, startupPolicy, ...;
without them the controller panics on a nil pointer), so its webhook has to be in the path as in a
cluster. Trainer v2.3.0 runs out of cluster with its certificate management off (`certManagement.enable:
false` in its Configuration); its webhook server reads a throwaway certificate from controller-runtime's
default directory under $TMPDIR; its webhooks are not registered (the test's TrainJobs are valid).
"""

from __future__ import annotations

import base64
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.e2e.test_operator_e2e import free_port, wait_for

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
TESTENV = ROOT / "testenv"
JOBSET_CRD = "jobset.x-k8s.io_jobsets.yaml"
# The namespaces whose JobSets go through the registered JobSet webhooks.
WEBHOOK_LABEL = "frscope-e2e/jobset-webhooks"
BUILD_NO_GO = 3


def default_release() -> str:
    """The JobSet release testenv/controllers/go.mod requires (the one Trainer's go.mod names), e.g. "0.12.0"."""
    found = re.search(r"^\s*sigs\.k8s\.io/jobset v(\d+\.\d+\.\d+)", (TESTENV / "controllers" / "go.mod").read_text(),
                      re.M)
    if found is None:
        raise RuntimeError(f"no sigs.k8s.io/jobset in {TESTENV / 'controllers' / 'go.mod'}")
    return found.group(1)


def releases() -> tuple[str, ...]:
    """Every JobSet release tested, newest (the default) first: the default and each testenv/jobset/<version>."""
    root = TESTENV / "jobset"
    others = {d.name for d in root.iterdir() if (d / "go.mod").is_file()} if root.is_dir() else set()
    return tuple(sorted(others | {default_release()}, key=lambda v: tuple(int(p) for p in v.split(".")),
                        reverse=True))


def _args(version: str) -> list[str]:
    return [] if version == default_release() else ["--jobset", version]


def build(version: str, *, manifests: bool = False) -> Path:
    """testenv/build-controllers [--jobset VERSION] [--manifests]: the output directory (skip without Go)."""
    extra = ["--manifests"] if manifests else []
    proc = subprocess.run([str(TESTENV / "build-controllers"), *_args(version), *extra], capture_output=True,
                          text=True, timeout=3600, check=False)
    if proc.returncode == BUILD_NO_GO:
        pytest.skip(f"Go is not installed: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def certificate(directory: Path) -> Path:
    """A throwaway serving certificate for 127.0.0.1 (tls.crt, tls.key), with the IP SAN the API server
    needs to call a webhook by URL."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(directory / "tls.key"),
                    "-out", str(directory / "tls.crt"), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return directory


def restart_job_accepted(kube: ControlPlane) -> bool:
    """Whether the JobSet CRD on the server accepts the RestartJob action (JobSet v0.12 on; v0.11's enum
    refuses it): a server-side dry run, so nothing is stored."""
    probe = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "probe", "namespace":
             "default"}, "spec": {"failurePolicy": {"rules": [{"name": "r", "action": "RestartJob"}]},
                                  "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
                                      "containers": [{"name": "c", "image": "registry.invalid/x:1"}]}}}}}]}}
    proc = kube.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", input=yaml.safe_dump(probe),
                        check=False)
    if proc.returncode != 0 and "Unsupported value: \"RestartJob\"" not in proc.stderr:
        raise AssertionError(f"the probe JobSet was refused for another reason: {proc.stderr}")
    return proc.returncode == 0


def wait_established(kube: ControlPlane, crd: str) -> None:
    """`kubectl wait --for=condition=Established` fails on a CRD just created (no conditions yet): poll."""
    wait_for(f"{crd} established", lambda: any(
        c["type"] == "Established" and c["status"] == "True"
        for c in kube.kubectl_json("get", "crd", crd).get("status", {}).get("conditions") or []), 60)


def install_crd(kube: ControlPlane, directory: Path, version: str) -> None:
    """Apply this release's JobSet CRD and wait until the server validates with it."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=frscope-testenv",
                 "-f", str(directory / JOBSET_CRD))
    wait_established(kube, "jobsets.jobset.x-k8s.io")
    wants = tuple(int(p) for p in version.split(".")) >= (0, 12, 0)
    wait_for(f"the JobSet v{version} CRD served", lambda: restart_job_accepted(kube) == wants, 60)


@contextmanager
def webhooks(kube: ControlPlane, port: int, ca: Path, version: str) -> Iterator[None]:
    """JobSet's defaulting and validating webhooks for JobSets (the paths of its config/components/webhook),
    by URL on loopback, for the namespaces labelled WEBHOOK_LABEL=true."""
    ca_bundle = base64.b64encode(ca.read_bytes()).decode()
    name = f"frscope-e2e-jobset-{version}"

    def hook(kind: str, operations: list[str]) -> dict[str, Any]:
        return {"name": f"{kind[0]}jobset.kb.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "timeoutSeconds": 10,
                "namespaceSelector": {"matchLabels": {WEBHOOK_LABEL: "true"}},
                "clientConfig": {"url": f"https://127.0.0.1:{port}/{kind}-jobset-x-k8s-io-v1alpha2-jobset",
                                 "caBundle": ca_bundle},
                "rules": [{"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"], "operations": operations,
                           "resources": ["jobsets"]}]}

    kube.apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": name}, "webhooks": [hook("mutate", ["CREATE"])]})
    kube.apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": name}, "webhooks": [hook("validate", ["CREATE", "UPDATE"])]})
    try:
        yield
    finally:
        kube.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", name,
                     "--ignore-not-found")


def stop(controller: subprocess.Popen[bytes]) -> None:
    controller.terminate()
    try:
        controller.wait(timeout=20)
    except subprocess.TimeoutExpired:
        controller.kill()
        controller.wait(timeout=10)


@contextmanager
def jobset_controller(kube: ControlPlane, version: str, default_manifests: Path,
                      work: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The real JobSet controller of this release out of cluster, its CRD on the server and its webhooks
    registered (for the labelled namespaces); afterwards the default release's CRD again."""
    binary = build(version) / "bin" / "jobset"
    if version != default_release():
        install_crd(kube, build(version, manifests=True), version)
    certs = certificate(work / "certs")
    port = free_port()
    config = {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
              "internalCertManagement": {"enable": False},
              "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
              "metrics": {"bindAddress": "0"},
              "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
              "leaderElection": {"leaderElect": False}}
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    try:
        with open(work / "jobset.log", "wb") as log, webhooks(kube, port, certs / "tls.crt", version):
            controller = subprocess.Popen([str(binary), "--config", str(work / "config.yaml")],
                                          env={**kube.env(), "KUBECONFIG": str(kube.kubeconfig)},
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                yield controller
            finally:
                stop(controller)
    finally:
        if version != default_release():
            install_crd(kube, default_manifests, default_release())


@contextmanager
def trainer_controller(kube: ControlPlane, manifests: Path, work: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The real Kubeflow Trainer controller manager (v2.3.0, testenv/build-controllers) out of cluster."""
    binary = build(default_release()) / "bin" / "trainer-controller-manager"
    kube.kubectl("apply", "--server-side", "--field-manager=frscope-testenv", "-f",
                 str(manifests / "trainer.kubeflow.org_trainingruntimes.yaml"))
    wait_established(kube, "trainingruntimes.trainer.kubeflow.org")
    # controller-runtime's default certificate directory: $TMPDIR/k8s-webhook-server/serving-certs.
    certificate(work / "k8s-webhook-server" / "serving-certs")
    config = {"apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
              "certManagement": {"enable": False},
              "webhook": {"port": free_port(), "host": "127.0.0.1"},
              "metrics": {"bindAddress": "0"},
              "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
              "leaderElection": {"leaderElect": False}}
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    with open(work / "trainer.log", "wb") as log:
        controller = subprocess.Popen([str(binary), "--config", str(work / "config.yaml")],
                                      env={**kube.env(), "KUBECONFIG": str(kube.kubeconfig), "TMPDIR": str(work)},
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            yield controller
        finally:
            stop(controller)
