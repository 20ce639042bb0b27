"""Proof that the e2e control plane is a real Kubernetes: the API server prunes, honours the status
subresource, authorizes with RBAC; the controller manager collects garbage; helm renders against it."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DIAGNOSED = "FlightRecorderDiagnosed"
MESSAGE = "rank 3 never joined ALLREDUCE #42 in group 0 (world, 4 ranks); ranks 0,1,2 waited 600s"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pytorchjob(name: str, namespace: str) -> dict[str, Any]:
    template = {
        "spec": {
            "containers": [
                {"name": "pytorch", "image": "registry.invalid/train:1", "command": ["python", "train.py"]},
            ]
        }
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
                "Worker": {"replicas": 3, "restartPolicy": "OnFailure", "template": template},
            }
        },
    }


def _configmap(name: str, namespace: str, owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if owners:
        metadata["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"k": "v"}}


@pytest.fixture
def namespace(kube: ControlPlane) -> Iterator[str]:
    name = f"e2e-{secrets.token_hex(4)}"
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def test_versions_are_the_release_everywhere(kube: ControlPlane) -> None:
    manifest = (kube.bin_dir.parent / "complete").read_text()
    release = re.search(r"^kubernetes (v\d+\.\d+\.\d+)$", manifest, re.M)
    assert release, manifest
    server = kube.get_raw("/version")
    assert server["gitVersion"] == release.group(1)
    assert (server["major"], server["minor"]) == tuple(release.group(1)[1:].split(".")[:2])
    both = kube.kubectl_json("version")
    assert both["clientVersion"]["gitVersion"] == both["serverVersion"]["gitVersion"] == release.group(1)


def test_condition_survives_status_patches_and_unknown_status_field_is_pruned(
    kube: ControlPlane, namespace: str
) -> None:
    job = kube.apply(_pytorchjob("hang", namespace))
    path = f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/hang/status"
    ours = {
        "type": DIAGNOSED,
        "status": "True",
        "reason": "CollectiveTimeout",
        "message": MESSAGE,
        "lastTransitionTime": _now(),
        "lastUpdateTime": _now(),
    }
    running = {
        "type": "Running",
        "status": "True",
        "reason": "PyTorchJobRunning",
        "message": "job is running",
        "lastTransitionTime": _now(),
    }
    # Ours first: the CRD's State column is .status.conditions[-1:].type, which must stay Running.
    patch = {"status": {"conditions": [ours, running], "frscopeUnknownField": {"rank": 3}}}

    # Exactly what a Python client sends (no fieldValidation): accepted, unknown field pruned, warned.
    status, headers, body = kube.request("PATCH", path, patch, "application/merge-patch+json")
    assert status == 200, body
    assert "frscopeUnknownField" not in body["status"]
    assert any("frscopeUnknownField" in w for w in headers.get("warning", [])), headers
    assert [c["type"] for c in body["status"]["conditions"]] == [DIAGNOSED, "Running"]

    # kubectl patch sends no fieldValidation either: pruned, and kubectl prints the server's warning.
    cli = kube.kubectl(
        "patch", "pytorchjob", "hang", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(patch),
    )  # fmt: skip
    assert "frscopeUnknownField" in cli.stderr, cli
    # Strict field validation refuses the unknown field outright: the CRD's schema is really enforced.
    status, _, body = kube.request("PATCH", path + "?fieldValidation=Strict", patch, "application/merge-patch+json")
    assert status in (400, 422) and "frscopeUnknownField" in body["message"], body

    # A later status patch of another field (as the training operator makes) keeps our condition.
    kube.kubectl(
        "patch",
        "pytorchjob",
        "hang",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"startTime": _now()}}),
    )
    # Through the status subresource spec changes are ignored; through the main resource, status ones.
    kube.kubectl(
        "patch",
        "pytorchjob",
        "hang",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"runPolicy": {"suspend": True}}}),
    )
    kube.kubectl(
        "patch",
        "pytorchjob",
        "hang",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"status": {"conditions": []}}),
    )

    stored = kube.kubectl_json("get", "pytorchjob", "hang", "-n", namespace)
    assert "frscopeUnknownField" not in stored["status"]
    assert "startTime" in stored["status"]
    assert stored["spec"].get("runPolicy", {}).get("suspend") is not True
    conditions = {c["type"]: c for c in stored["status"]["conditions"]}
    assert conditions[DIAGNOSED]["reason"] == "CollectiveTimeout"
    assert conditions[DIAGNOSED]["message"] == MESSAGE
    table = kube.kubectl("get", "pytorchjob", "hang", "-n", namespace).stdout
    assert re.search(r"^hang\s+Running\s", table, re.M), table

    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"hang.{secrets.token_hex(8)}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "name": "hang",
            "namespace": namespace,
            "uid": job["metadata"]["uid"],
        },
        "type": "Warning",
        "reason": "CollectiveTimeout",
        "message": MESSAGE,
        "source": {"component": "frscope"},
        "reportingComponent": "frscope",
        "reportingInstance": "frscope-e2e",
        "firstTimestamp": _now(),
        "lastTimestamp": _now(),
        "count": 1,
    }
    kube.kubectl("create", "-f", "-", input=json.dumps(event))

    described = kube.kubectl("describe", "pytorchjob", "hang", "-n", namespace).stdout
    assert f"Type:                  {DIAGNOSED}" in described or re.search(rf"Type:\s+{DIAGNOSED}", described), (
        described
    )
    assert re.search(r"Reason:\s+CollectiveTimeout", described), described
    assert MESSAGE in described
    events = described.split("Events:", 1)[1]
    assert re.search(r"Warning\s+CollectiveTimeout\s+.*frscope\s+" + re.escape(MESSAGE), events), events


def test_dependents_of_a_deleted_owner_are_garbage_collected(kube: ControlPlane, namespace: str) -> None:
    job = kube.apply(_pytorchjob("owner", namespace))
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": "owner",
        "uid": job["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    gone = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": "long-gone",
        "uid": str(uuid.uuid4()),
    }
    kube.apply(_configmap("report", namespace, [owner]))
    kube.apply(_configmap("dangling", namespace, [gone]))
    kube.apply(_configmap("unowned", namespace))

    kube.kubectl("delete", "pytorchjob", "owner", "-n", namespace, "--wait=true")
    for name in ("report", "dangling"):
        kube.kubectl("wait", "--for=delete", f"configmap/{name}", "-n", namespace, "--timeout=90s", timeout=100)
    assert kube.kubectl_json("get", "configmap", "unowned", "-n", namespace)["data"] == {"k": "v"}


def test_deleting_a_namespace_deletes_what_is_in_it(kube: ControlPlane) -> None:
    name = f"e2e-{secrets.token_hex(4)}"
    kube.kubectl("create", "namespace", name)
    kube.apply(_pytorchjob("job", name))
    kube.apply(_configmap("cm", name))
    kube.kubectl("delete", "namespace", name, "--wait=true", "--timeout=90s", timeout=100)
    absent = kube.kubectl("get", "namespace", name, check=False)
    assert absent.returncode != 0 and "NotFound" in absent.stderr, absent


def test_a_narrow_role_is_refused_what_it_does_not_grant(kube: ControlPlane, namespace: str, tmp_path: Path) -> None:
    sa = "frscope-reader"
    kube.kubectl("create", "serviceaccount", sa, "-n", namespace)
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pytorchjob-reader", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["kubeflow.org"],
                    "resources": ["pytorchjobs"],
                    "verbs": ["get", "list", "watch"],
                },
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            ],
        }
    )
    kube.kubectl(
        "create",
        "rolebinding",
        "pytorchjob-reader",
        "-n",
        namespace,
        "--role=pytorchjob-reader",
        f"--serviceaccount={namespace}:{sa}",
    )
    who = f"system:serviceaccount:{namespace}:{sa}"

    def can_i(verb: str, resource: str, *extra: str, ns: str = namespace) -> bool:
        proc = kube.kubectl("auth", "can-i", verb, resource, "-n", ns, "--as", who, *extra, check=False)
        assert proc.stdout.strip() in ("yes", "no"), proc
        return proc.stdout.strip() == "yes"

    assert can_i("get", "pytorchjobs.kubeflow.org")
    assert can_i("watch", "pytorchjobs.kubeflow.org")
    assert can_i("create", "events")
    assert not can_i("delete", "pytorchjobs.kubeflow.org")
    assert not can_i("patch", "pytorchjobs.kubeflow.org", "--subresource=status")
    assert not can_i("get", "pods")
    assert not can_i("get", "secrets")
    assert not can_i("get", "pytorchjobs.kubeflow.org", ns="default")

    # The same with the service account's own token (TokenRequest, signed with the testenv's key).
    kube.apply(_pytorchjob("job", namespace))
    token = kube.kubectl("create", "token", sa, "-n", namespace).stdout.strip()
    as_sa = tmp_path / "sa.kubeconfig"
    kube.write_token_kubeconfig(as_sa, token, sa)
    listed = kube.kubectl("get", "pytorchjobs", "-n", namespace, "-o", "name", kubeconfig=as_sa)
    assert listed.stdout.split() == ["pytorchjob.kubeflow.org/job"]
    refused = kube.kubectl("delete", "pytorchjob", "job", "-n", namespace, kubeconfig=as_sa, check=False)
    assert refused.returncode != 0
    assert f'User "{who}" cannot delete resource "pytorchjobs" in API group "kubeflow.org"' in refused.stderr
    status, _, body = kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets", token=token)
    assert status == 403 and body["reason"] == "Forbidden", body


_CLUSTER_SCOPED = frozenset(
    {
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "PriorityClass",
        "Namespace",
    }
)


def _tiny_chart(directory: Path) -> Path:
    (directory / "templates").mkdir(parents=True)
    (directory / "Chart.yaml").write_text(
        "apiVersion: v2\nname: tiny\ndescription: a chart the e2e tests generate\ntype: application\n"
        'version: 0.1.0\nappVersion: "0.1.0"\nkubeVersion: ">=1.30.0-0"\n'
        "icon: https://example.invalid/icon.png\n"
    )
    (directory / "values.yaml").write_text("greeting: hello\n")
    (directory / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-tiny\n"
        "  namespace: {{ .Release.Namespace }}\n"
        "  labels:\n    app.kubernetes.io/name: {{ .Chart.Name }}\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
        "  kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    return directory


def test_helm_lints_and_renders_charts_against_the_api_server(
    kube: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    charts = [_tiny_chart(tmp_path / "tiny")]
    if (ROOT / "charts" / "frscope" / "Chart.yaml").is_file():
        charts.append(ROOT / "charts" / "frscope")
    env = kube.env()
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(tmp_path / var.lower())

    def helm(*args: str) -> str:
        proc = subprocess.run(
            [str(kube.bin_dir / "helm"), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    minor = kube.get_raw("/version")["minor"]
    for chart in charts:
        assert "0 chart(s) failed" in helm("lint", str(chart))
        # Offline: helm's built-in capabilities come from its ldflags, not v1.20.
        offline = helm("template", "e2e", str(chart), "--namespace", namespace)
        # Against the API server: its version, its schemas (--validate), then a server-side dry run.
        online = helm("template", "e2e", str(chart), "--namespace", namespace, "--validate")
        # No `-n`: every namespaced object names its own namespace (the release's, or `default` for the
        # node Events the operator reads), and kubectl refuses a document whose namespace differs from -n.
        applied = kube.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", input=online).stdout
        # Nothing lands in kubectl's own default namespace by omission: each namespaced object names one.
        for item in json.loads(applied).get("items", []):
            meta = item["metadata"]
            if item["kind"] not in _CLUSTER_SCOPED:
                # `default` only for the Role (and binding) that reads and writes nodes' Events there
                in_default = meta.get("namespace") == "default" and meta["name"].endswith("-events")
                assert meta.get("namespace") == namespace or in_default, (item["kind"], meta["name"], meta)
        if chart.name == "tiny":
            assert f'kubeVersion: "v1.{minor}.0"' in offline, offline
            assert f'kubeVersion: "{kube.get_raw("/version")["gitVersion"]}"' in online, online
