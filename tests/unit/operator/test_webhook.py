"""The injection itself, as a pure function (the API server path is in tests/e2e/test_operator_webhook.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from frscope.operator import names
from frscope.operator.command import injection_from_env
from frscope.operator.injection import InjectionConfig, inject, mutate, native_sidecars_supported


def training_pod(opt_in: str | None = "label", env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"generateName": "train-worker-", "namespace": "ml",
                            "labels": {names.LABEL_JOB_NAME: "train"}}
    if opt_in == "label":
        meta["labels"][names.INJECT_KEY] = "true"
    elif opt_in == "annotation":
        meta["annotations"] = {names.INJECT_KEY: "true"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "pytorch", "image": "trainer:1", "env": env or []},
                                    {"name": "log-shipper", "image": "fluent:1"}]}}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_native_sidecar_with_volume_env_and_termination_policy() -> None:
    cfg = InjectionConfig(image="frscope:9", port=9402, buffer_size=4000, operator_url="http://op:80",
                          stall_after_s=30)
    out = inject(training_pod(), cfg)
    assert out is not None
    [sidecar] = out["spec"]["initContainers"]
    assert sidecar["name"] == names.SIDECAR_CONTAINER and sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "frscope:9"
    assert {"name": "frscope", "containerPort": 9402, "protocol": "TCP"} in sidecar["ports"]
    assert "--operator-url=http://op:80" in sidecar["args"] and "--stall-after=30" in sidecar["args"]
    assert "--install-bootstrap=/run/frscope/python" in sidecar["args"]
    assert {"name": "frscope", "emptyDir": {}} in out["spec"]["volumes"]
    trainer, shipper = out["spec"]["containers"]
    env = env_of(trainer)
    assert env["TORCH_FR_BUFFER_SIZE"] == "4000"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/run/frscope/dumps/nccl_trace_rank_"
    assert env["FRSCOPE_SOCKET_DIR"] == "/run/frscope" and env["PYTHONPATH"] == "/run/frscope/python"
    assert trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {"name": "frscope", "mountPath": "/run/frscope"} in trainer["volumeMounts"]
    assert "env" not in shipper and "volumeMounts" not in shipper  # only the trainer is touched
    assert out["metadata"]["annotations"][names.ANN_INJECTED] == "native-sidecar"


def test_plain_container_where_native_sidecars_are_not_supported() -> None:
    out = inject(training_pod(), InjectionConfig(native=False))
    assert out is not None and "initContainers" not in out["spec"]
    assert out["spec"]["containers"][-1]["name"] == names.SIDECAR_CONTAINER
    assert "restartPolicy" not in out["spec"]["containers"][-1]
    assert native_sidecars_supported(1, 29) and native_sidecars_supported(2, 0)
    assert not native_sidecars_supported(1, 28)


def test_idempotent_and_opt_in_only() -> None:
    cfg = InjectionConfig()
    once = inject(training_pod(), cfg)
    assert once is not None
    assert inject(once, cfg) is None  # never twice
    assert inject(training_pod(opt_in=None), cfg) is None
    # An annotation alone is no opt-in: the webhook configuration's objectSelector sees labels only,
    # so such a pod would never reach the webhook in a cluster.
    assert inject(training_pod(opt_in="annotation"), cfg) is None


def test_namespace_opt_in_with_a_pod_opt_out() -> None:
    cfg = InjectionConfig()
    out = inject(training_pod(opt_in=None), cfg, namespace_opted_in=True)
    assert out is not None and out["spec"]["initContainers"][0]["name"] == names.SIDECAR_CONTAINER
    assert out["metadata"]["labels"][names.INJECT_KEY] == "true"  # so the PodMonitor scrapes it
    refused = training_pod(opt_in=None)
    refused["metadata"]["labels"][names.INJECT_KEY] = "false"
    assert inject(refused, cfg, namespace_opted_in=True) is None


def test_nccl_timing_by_default_off_by_setting_or_by_the_pod() -> None:
    on = inject(training_pod(), InjectionConfig())
    assert on is not None and env_of(on["spec"]["containers"][0])["TORCH_NCCL_ENABLE_TIMING"] == "1"
    off = inject(training_pod(), injection_from_env({"FRSCOPE_NCCL_TIMING": "false"}))
    assert off is not None and "TORCH_NCCL_ENABLE_TIMING" not in env_of(off["spec"]["containers"][0])
    mine = inject(training_pod(env=[{"name": "TORCH_NCCL_ENABLE_TIMING", "value": "0"}]), InjectionConfig())
    assert mine is not None and env_of(mine["spec"]["containers"][0])["TORCH_NCCL_ENABLE_TIMING"] == "0"


def test_existing_env_is_kept_and_pythonpath_extended() -> None:
    pod = training_pod(env=[{"name": "TORCH_FR_BUFFER_SIZE", "value": "100"},
                            {"name": "PYTHONPATH", "value": "/app/src"}])
    out = inject(pod, InjectionConfig())
    assert out is not None
    env = env_of(out["spec"]["containers"][0])
    assert env["TORCH_FR_BUFFER_SIZE"] == "100"
    assert env["PYTHONPATH"] == "/run/frscope/python:/app/src"


@pytest.mark.parametrize("name", ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"])
def test_a_recorder_setting_the_pod_sets_under_either_name_is_kept(name: str) -> None:
    """torch reads TORCH_FR_* before its TORCH_NCCL_* alias: injecting the new name beside a pod's old one would
    override the pod's value. Settings the pod leaves alone come under both names."""
    pod = training_pod(env=[{"name": name, "value": "20000"},
                            {"name": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "value": "/data/fr_"}])
    out = inject(pod, InjectionConfig(buffer_size=4000))
    assert out is not None
    env = env_of(out["spec"]["containers"][0])
    assert {k: v for k, v in env.items() if "BUFFER_SIZE" in k} == {name: "20000"}
    assert {k: v for k, v in env.items() if "TEMP_FILE" in k} == {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/data/fr_"}
    assert env["TORCH_FR_DUMP_ON_TIMEOUT"] == env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


def test_the_images_pythonpath_from_the_annotation_follows_the_bootstrap() -> None:
    """Kubernetes' container env replaces an image's ENV PYTHONPATH; the pod template passes the image's
    value in frscope.io/pythonpath and keeps it (a PYTHONPATH the pod sets itself wins, as above)."""
    pod = training_pod()
    pod["metadata"].setdefault("annotations", {})["frscope.io/pythonpath"] = "/opt/app/lib:/opt/app/src"
    out = inject(pod, InjectionConfig())
    assert out is not None
    assert env_of(out["spec"]["containers"][0])["PYTHONPATH"] == "/run/frscope/python:/opt/app/lib:/opt/app/src"
    plain = inject(training_pod(), InjectionConfig())
    assert plain is not None and env_of(plain["spec"]["containers"][0])["PYTHONPATH"] == "/run/frscope/python"


def test_input_is_not_mutated_and_errors_fail_open() -> None:
    pod = training_pod()
    before = copy.deepcopy(pod)
    assert inject(pod, InjectionConfig()) is not None
    assert pod == before
    broken = training_pod()
    broken["spec"]["containers"] = [{"name": "pytorch", "env": "not-a-list"}]
    assert mutate(broken, InjectionConfig()) is None  # logged, admitted unchanged


def test_settings_from_the_charts_environment() -> None:
    cfg = injection_from_env({
        "FRSCOPE_INJECT_LABEL": "example.com/frscope=yes", "FRSCOPE_SIDECAR_IMAGE": "reg/frscope:1.2",
        "FRSCOPE_SIDECAR_PORT": "9500", "FRSCOPE_RECORDER_BUFFER_SIZE": "5000",
        "FRSCOPE_SIDECAR_RESOURCES": '{"requests": {"cpu": "20m"}}', "FRSCOPE_SIDECAR_STALL_AFTER": "45",
        "FRSCOPE_SIDECAR_SUSPECT_AFTER": "12", "FRSCOPE_SIDECAR_SUSPECT_MIN": "3",
        "FRSCOPE_SIDECAR_STRAGGLER_MIN_SHARE": "0.25", "FRSCOPE_SIDECAR_METRICS_DETAIL": "rank-group",
    })
    assert cfg.inject_label == ("example.com/frscope", "yes") and cfg.port == 9500 and cfg.buffer_size == 5000
    pod = training_pod(opt_in=None)
    pod["metadata"]["labels"]["example.com/frscope"] = "yes"
    out = inject(pod, cfg)
    assert out is not None
    assert out["spec"]["initContainers"][0]["resources"] == {"requests": {"cpu": "20m"}}
    args = out["spec"]["initContainers"][0]["args"]
    assert {"--stall-after=45", "--suspect-after=12", "--suspect-min=3", "--straggler-min-share=0.25",
            "--metrics-detail=rank-group"} <= set(args)


def test_kubernetes_identity_mounts_the_projected_tokens_in_the_sidecar_only() -> None:
    cfg = injection_from_env({"FRSCOPE_OPERATOR_IDENTITY": "system:serviceaccount:frscope:frscope",
                              "FRSCOPE_TOKEN_EXPIRATION_SECONDS": "1800"})
    out = inject(training_pod(), cfg)
    assert out is not None
    [sidecar] = out["spec"]["initContainers"]
    assert "--operator-identity=system:serviceaccount:frscope:frscope" in sidecar["args"]
    assert "--kube-token-dir=/var/run/secrets/frscope" in sidecar["args"]
    assert {"name": names.SIDECAR_TOKEN_VOLUME, "mountPath": "/var/run/secrets/frscope",
            "readOnly": True} in sidecar["volumeMounts"]
    [volume] = [v for v in out["spec"]["volumes"] if v["name"] == names.SIDECAR_TOKEN_VOLUME]
    sources = volume["projected"]["sources"]
    tokens = {s["serviceAccountToken"]["path"]: s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s}
    assert tokens["operator-token"]["audience"] == names.AUDIENCE_OPERATOR
    assert "audience" not in tokens["api-token"]  # the API server's own: reads the issuer keys
    assert {t["expirationSeconds"] for t in tokens.values()} == {1800}
    assert {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}} in sources
    # The trainers never see the tokens.
    for container in out["spec"]["containers"]:
        assert all(m["name"] != names.SIDECAR_TOKEN_VOLUME for m in container.get("volumeMounts", []))
    # Without an operator identity, nothing of it.
    plain = inject(training_pod(), InjectionConfig())
    assert plain is not None and all(v["name"] != names.SIDECAR_TOKEN_VOLUME for v in plain["spec"]["volumes"])


RESTRICTED = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
              "seccompProfile": {"type": "RuntimeDefault"}}


def _effective(pod_ctx: dict[str, Any], container_ctx: dict[str, Any], key: str) -> Any:
    """What the kubelet applies: the container's field, else the pod's (runAsUser, runAsGroup, runAsNonRoot,
    seccompProfile are inherited from the pod's securityContext)."""
    return container_ctx[key] if key in container_ctx else pod_ctx.get(key)


def test_the_sidecar_runs_as_its_own_non_root_user_whatever_the_pod_says() -> None:
    """A root pod (runAsUser 0, runAsNonRoot false) must not hand the sidecar root, and a pod-level root user
    next to the sidecar's runAsNonRoot would keep the pod in Init: the sidecar's container sets its own user,
    group and the restricted profile, so neither the root pod nor a restricted pod changes what it runs as."""
    root = {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "seccompProfile": {"type": "Unconfined"}}
    restricted = {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True, "fsGroup": 1000,
                  "seccompProfile": {"type": "RuntimeDefault"}}
    cfg = injection_from_env({"FRSCOPE_SIDECAR_RUN_AS_USER": "65532", "FRSCOPE_SIDECAR_RUN_AS_GROUP": "65533"})
    for pod_ctx in (root, restricted, {}):
        pod = training_pod()
        pod["spec"]["securityContext"] = copy.deepcopy(pod_ctx)
        for native in (True, False):
            out = inject(pod, InjectionConfig(native=native, run_as_user=cfg.run_as_user,
                                              run_as_group=cfg.run_as_group))
            assert out is not None
            [sidecar] = [c for c in out["spec"].get("initContainers", []) + out["spec"]["containers"]
                         if c["name"] == names.SIDECAR_CONTAINER]
            ctx = sidecar["securityContext"]
            assert RESTRICTED.items() <= ctx.items(), ctx
            assert _effective(pod_ctx, ctx, "runAsUser") == 65532
            assert _effective(pod_ctx, ctx, "runAsGroup") == 65533
            assert _effective(pod_ctx, ctx, "runAsNonRoot") is True
            assert _effective(pod_ctx, ctx, "seccompProfile") == {"type": "RuntimeDefault"}
            assert out["spec"]["securityContext"] == pod_ctx  # the pod's own settings are left as they are
    assert (InjectionConfig().run_as_user, InjectionConfig().run_as_group) == (65532, 65532)  # the image's USER
