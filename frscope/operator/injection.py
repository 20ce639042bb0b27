"""The opt-in mutating admission webhook: adds the frscope sidecar to a PyTorchJob's pods.

`inject()` is a pure function (pod dict in, JSON-able pod dict out, or None when nothing is to be
done); `register_webhook()` hangs it on a kopf registry as handler id `inject`, served at `/inject`.
The handler never denies a pod: any error is logged and the pod is admitted unchanged (fails open,
and the webhook configuration says `failurePolicy: Ignore` for when the operator is down).

What an opted-in pod gets:
- the sidecar: a native sidecar (an init container with `restartPolicy: Always`, Kubernetes >= 1.29)
  where the server supports it, a regular container otherwise; a port named `frscope`; with
  `--schedule-key=<namespace>/<job name>` when the pod's labels name its job, so every sidecar of
  the job polls on the same wall-clock slots (frscope.sidecar.schedule);
- an `emptyDir` volume shared by the sidecar and the trainer, mounted at `mount_path`;
- in the trainer container(s): `TORCH_FR_BUFFER_SIZE`, the on-timeout dump prefix `TORCH_FR_DUMP_TEMP_FILE`
  in the shared volume and `TORCH_FR_DUMP_ON_TIMEOUT=1`, each with its old `TORCH_NCCL_*` name (a pod that
  sets either name of one keeps its value: RECORDER_SETTINGS), `FRSCOPE_SOCKET_DIR` and
  `PYTHONPATH` for the sidecar's sitecustomize bootstrap (which starts torch's worker server per
  rank; the image's own PYTHONPATH, which the container env replaces, is appended from the
  annotation `frscope.io/pythonpath`), `terminationMessagePolicy: FallbackToLogsOnError` (so the
  watchdog's message reaches the pod status); variables the pod already sets are left as they are;
- with Kubernetes identity (`operator_identity` set, the chart's default): a projected volume in
  the sidecar only, with the pod's service-account token for the operator's audience (what pushes
  carry; bound to the pod, so the operator learns the pod from it), one for the API server's own
  audience (to read the cluster's issuer keys, which every service account may) and the cluster CA;
  and `--operator-identity`, so the sidecar accepts the operator's token only;
- with TLS (`certificate_url`): `--certificate-url`, so the sidecar serves HTTPS with a certificate the
  operator issues for this pod, and HTTPS probes;
- `TORCH_NCCL_ENABLE_TIMING=1` in the trainer unless turned off (`nccl_timing`);
- the sidecar's own restricted security context (non-root `run_as_user`/`run_as_group`, no privilege
  escalation, no capabilities, RuntimeDefault seccomp), whatever the pod's own says;
- the annotation `frscope.io/injected` (informational: a pod can set it itself; a second pass is a
  no-op because the `frscope` container is there, and the operator trusts a sidecar only when it is as
  injected, `sidecar_as_injected`).

Opt-in: the pod label (`inject_label`), or the same label on the pod's namespace (a second webhook,
`NAMESPACE_WEBHOOK_ID`, whose namespaceSelector picks those namespaces; a pod label `=false` opts out).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from frscope.operator import names
from frscope.operator.model import jobkinds
from frscope.operator.model.objects import PodInfo, pod_info

log = logging.getLogger(__name__)

WEBHOOK_ID = "inject"
# Served at /inject-namespace: pods the API server sends because their *namespace* carries the opt-in
# label (the webhook configuration's namespaceSelector decided; a pod can opt out with label=false).
NAMESPACE_WEBHOOK_ID = "inject-namespace"


@dataclass(frozen=True, slots=True)
class InjectionConfig:
    image: str = "frscope:latest"
    image_pull_policy: str = "IfNotPresent"
    port: int = 9402
    mount_path: str = "/run/frscope"
    buffer_size: int = 2000
    native: bool = True  # init container with restartPolicy Always (decided from the server version)
    poll_interval_s: float | None = None
    stall_after_s: float | None = None
    suspect_after_s: float | None = None  # the sidecar's --suspect-after / --suspect-min (None: its default)
    suspect_min_s: float | None = None
    straggler_min_share: float | None = None  # the sidecar's --straggler-min-share (None: its default)
    metrics_detail: str | None = None  # the sidecar's --metrics-detail (None: its default)
    operator_url: str | None = None
    # TLS to the sidecars: the operator's base URL where each sidecar asks for its certificate
    # (`--certificate-url`); the sidecar then serves HTTPS only and its probes say HTTPS. None: plain HTTP.
    certificate_url: str | None = None
    # base64 of the PEM CA that signed the operator's HTTPS certificate (the sidecar CA, set by the operator
    # at start): the sidecars check the operator against it when they push or ask for their certificate.
    operator_ca: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    inject_label: tuple[str, str] = (names.INJECT_KEY, "true")
    # TORCH_NCCL_ENABLE_TIMING=1 in the trainer: NCCL entries then carry `started` and `duration_ms`
    # (one more CUDA event per collective; docs/install.md). A pod that sets the variable keeps its value.
    nccl_timing: bool = True
    log_format: str = "text"  # the sidecar's --log-format
    version: str = "1"
    # system:serviceaccount:NS:NAME of the operator: the sidecars accept its tokens only. None: the
    # sidecars are injected without authentication.
    operator_identity: str | None = None
    token_expiration_s: int = 3600
    token_mount: str = "/var/run/secrets/frscope"
    # The sidecar's own user and group (the image's 65532), set on the container whatever the pod says: a pod
    # running as root (runAsNonRoot false) would otherwise hand the sidecar root, and a pod-level runAsUser
    # of 0 next to the sidecar's runAsNonRoot would keep the pod in Init.
    run_as_user: int = 65532
    run_as_group: int = 65532

    @property
    def dump_dir(self) -> str:
        return f"{self.mount_path}/dumps"

    @property
    def bootstrap_dir(self) -> str:
        return f"{self.mount_path}/python"


def native_sidecars_supported(major: int, minor: int) -> bool:
    """SidecarContainers is beta and on by default from Kubernetes 1.29 (GA in 1.33)."""
    return (major, minor) >= (1, 29)


def _label(pod: dict[str, Any], key: str) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(key, "")).lower()


def opted_in(pod: dict[str, Any], cfg: InjectionConfig) -> bool:
    """The pod carries the opt-in label. (A label, not an annotation: the webhook configuration's
    objectSelector only sees labels, so an annotation-only pod would never reach the webhook.)"""
    key, value = cfg.inject_label
    return _label(pod, key) == value.lower()


def opted_out(pod: dict[str, Any], cfg: InjectionConfig) -> bool:
    """The pod says `<inject label>=false`: no sidecar, even in an opted-in namespace."""
    return _label(pod, cfg.inject_label[0]) == "false"


def already_injected(pod: dict[str, Any]) -> bool:
    """A container named like the sidecar is there (a second pass, or one the pod brought itself: the
    webhook then leaves the pod alone, and `sidecar_as_injected` decides whether the operator trusts
    it). The `frscope.io/injected` annotation alone proves nothing: a pod can set it."""
    spec = pod.get("spec") or {}
    return any(
        isinstance(c, dict) and c.get("name") == names.SIDECAR_CONTAINER
        for key in ("initContainers", "containers")
        for c in spec.get(key) or []
    )


# Where the API server's ServiceAccount admission mounts the pod's API token into every container.
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def _image_repository(image: str) -> str:
    """`registry/repo:tag@digest` -> `registry/repo` (a chart upgrade changes the tag of new pods only)."""
    image = image.split("@", 1)[0]
    slash = image.rfind("/")
    colon = image.rfind(":")
    return image[:colon] if colon > slash else image


def sidecar_as_injected(pod: dict[str, Any], cfg: InjectionConfig) -> str | None:
    """None when the pod's `frscope` port is served by a sidecar as the webhook injects it; else why not.

    The operator shows a pod's sidecar a credential (and reads its answers as evidence) only then: the
    container named `frscope`, with the configured image's repository (any tag: pods injected before an
    upgrade keep theirs), no `command` (the image's entry point), no environment but the downward-API
    variables the webhook sets (a PYTHONPATH would run other code in the image), mounts only at the
    webhook's paths, the one port named `frscope`, which no other container declares."""
    spec = pod.get("spec") or {}
    containers = [c for key in ("initContainers", "containers") for c in spec.get(key) or [] if isinstance(c, dict)]
    ours = [c for c in containers if c.get("name") == names.SIDECAR_CONTAINER]
    if len(ours) != 1:
        return "no container named frscope"
    sidecar = ours[0]
    for other in containers:
        if other is not sidecar and any(isinstance(p, dict) and p.get("name") == names.SIDECAR_PORT_NAME
                                        for p in other.get("ports") or []):
            return f"container {str(other.get('name'))[:60]!r} declares the frscope port"
    if _image_repository(str(sidecar.get("image") or "")) != _image_repository(cfg.image):
        return f"image {str(sidecar.get('image'))[:120]!r} is not {_image_repository(cfg.image)}"
    if sidecar.get("command") or sidecar.get("envFrom") or sidecar.get("workingDir"):
        return "command, envFrom or workingDir set"
    allowed_env = {"POD_NAME", "POD_NAMESPACE", "NODE_NAME"}
    env = [e.get("name") for e in sidecar.get("env") or [] if isinstance(e, dict)]
    if any(name not in allowed_env for name in env):
        return "environment other than the webhook's"
    mounts = {m.get("mountPath") for m in sidecar.get("volumeMounts") or [] if isinstance(m, dict)}
    if not mounts <= {cfg.mount_path, cfg.token_mount, SERVICE_ACCOUNT_MOUNT}:
        return "mounts other than the webhook's"
    ports = [p for p in sidecar.get("ports") or [] if isinstance(p, dict) and p.get("name") == names.SIDECAR_PORT_NAME]
    if len(ports) != 1:
        return "not one frscope port"
    return None


def schedule_key(pod: dict[str, Any]) -> str | None:
    """`<namespace>/<job name>` from the pod's job labels (PyTorchJob, TrainJob/JobSet): the same in
    every pod of the job, so their sidecars poll on the same slots (frscope.sidecar.schedule). None:
    the pod names no job (its sidecar polls on the interval's multiples since the epoch)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    job = jobkinds.pod_job(labels) if isinstance(labels, dict) else None
    if job is None:
        return None
    return f"{meta.get('namespace') or ''}/{job.job_name}"


def sidecar_container(cfg: InjectionConfig, key: str | None = None) -> dict[str, Any]:
    args = [
        "sidecar",
        f"--socket-dir={cfg.mount_path}",
        f"--dump-dir={cfg.dump_dir}",
        f"--install-bootstrap={cfg.bootstrap_dir}",
        f"--port={cfg.port}",
    ]
    if cfg.poll_interval_s is not None:
        args.append(f"--poll-interval={cfg.poll_interval_s:g}")
    if cfg.stall_after_s is not None:
        args.append(f"--stall-after={cfg.stall_after_s:g}")
    if cfg.suspect_after_s is not None:
        args.append(f"--suspect-after={cfg.suspect_after_s:g}")
    if cfg.suspect_min_s is not None:
        args.append(f"--suspect-min={cfg.suspect_min_s:g}")
    if cfg.straggler_min_share is not None:
        args.append(f"--straggler-min-share={cfg.straggler_min_share:g}")
    if cfg.metrics_detail is not None:
        args.append(f"--metrics-detail={cfg.metrics_detail}")
    if key:
        args.append(f"--schedule-key={key}")
    if cfg.operator_url:
        args.append(f"--operator-url={cfg.operator_url}")
    if cfg.operator_identity:
        args += [f"--operator-identity={cfg.operator_identity}", f"--kube-token-dir={cfg.token_mount}"]
        if cfg.certificate_url:
            args.append(f"--certificate-url={cfg.certificate_url}")
        if cfg.operator_ca:
            args.append(f"--operator-ca={cfg.operator_ca}")
    if cfg.log_format != "text":
        args.append(f"--log-format={cfg.log_format}")
    # The kubelet does not check the certificate of an HTTPS probe: the placeholder one the sidecar serves
    # until the operator issues its own (frscope.sidecar.tls) passes, so the trainer never waits on it.
    https = {"scheme": "HTTPS"} if cfg.certificate_url and cfg.operator_identity else {}
    container: dict[str, Any] = {
        "name": names.SIDECAR_CONTAINER,
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "args": args,
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "ports": [{"name": names.SIDECAR_PORT_NAME, "containerPort": cfg.port, "protocol": "TCP"}],
        "volumeMounts": [{"name": names.SIDECAR_VOLUME, "mountPath": cfg.mount_path}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": names.SIDECAR_PORT_NAME, **https},
                           "periodSeconds": 10},
        # The restricted Pod Security profile on the container itself, so that no pod-level setting (root, a
        # privileged profile, another user) reaches the sidecar. It reads the trainer's sockets (0666) and
        # dumps in the shared emptyDir (world-writable; its dump dir 1777) as this user.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": cfg.run_as_user,
            "runAsGroup": cfg.run_as_group,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if cfg.operator_identity:
        container["volumeMounts"].append({"name": names.SIDECAR_TOKEN_VOLUME, "mountPath": cfg.token_mount,
                                          "readOnly": True})
    if cfg.resources:
        container["resources"] = copy.deepcopy(cfg.resources)
    if cfg.native:
        container["restartPolicy"] = "Always"
        # A native sidecar must be up before the trainer starts: the trainer's bootstrap is in the volume.
        container["startupProbe"] = {"httpGet": {"path": "/healthz", "port": names.SIDECAR_PORT_NAME, **https},
                                     "periodSeconds": 1, "failureThreshold": 60}
    return container


def token_volume(cfg: InjectionConfig) -> dict[str, Any]:
    """The sidecar's projected tokens (mounted in the sidecar only, never in the trainer).

    Readable by every user (0444): the kubelet writes them as root and hands them to the container's
    user only when every container of the pod names the same runAsUser, which a trainer running as
    root does not; with 0440 the sidecar (65532) could not read them. Only the
    sidecar mounts the volume."""
    expiry = cfg.token_expiration_s
    return {"name": names.SIDECAR_TOKEN_VOLUME, "projected": {"defaultMode": 0o444, "sources": [
        {"serviceAccountToken": {"audience": names.AUDIENCE_OPERATOR, "expirationSeconds": expiry,
                                 "path": "operator-token"}},
        {"serviceAccountToken": {"expirationSeconds": expiry, "path": "api-token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    ]}}


# The recorder's settings under torch's names: the TORCH_FR_* name first, then its old TORCH_NCCL_* alias
# (torch >= 2.9 reads both and the first one set wins; older torch knows only the alias). A pod that sets
# any name of a setting keeps its own value: injecting the other name would override it (TORCH_FR_* wins).
RECORDER_SETTINGS: tuple[tuple[str, ...], ...] = (
    ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT"),
)


def trainer_env(cfg: InjectionConfig) -> list[dict[str, Any]]:
    prefix = f"{cfg.dump_dir}/nccl_trace_rank_"
    values = (str(cfg.buffer_size), prefix, "1")
    return [
        *({"name": name, "value": value} for names_, value in zip(RECORDER_SETTINGS, values, strict=True)
          for name in names_),
        {"name": "FRSCOPE_SOCKET_DIR", "value": cfg.mount_path},
        *([{"name": "TORCH_NCCL_ENABLE_TIMING", "value": "1"}] if cfg.nccl_timing else []),
    ]


def _set_by_the_pod(present: set[Any]) -> set[str]:
    """The recorder names not to inject: every name of a setting the pod sets under any of its names."""
    return {name for aliases in RECORDER_SETTINGS if present & set(aliases) for name in aliases}


def _trainers(containers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    named = [c for c in containers if c.get("name") in names.TRAINER_CONTAINERS]
    return named or [c for c in containers if c.get("name") != names.SIDECAR_CONTAINER]


def _add_env(container: dict[str, Any], cfg: InjectionConfig, image_pythonpath: str) -> None:
    env = container.setdefault("env", [])
    present = {e.get("name") for e in env if isinstance(e, dict)}
    skip = present | _set_by_the_pod(present)
    for var in trainer_env(cfg):
        if var["name"] not in skip:
            env.append(var)
    # PYTHONPATH: put the bootstrap first, keep whatever the pod sets (not an image's ENV: see docs).
    for var in env:
        if isinstance(var, dict) and var.get("name") == "PYTHONPATH" and "value" in var:
            parts = str(var.get("value") or "").split(":")
            if cfg.bootstrap_dir not in parts:
                var["value"] = ":".join([cfg.bootstrap_dir, *[p for p in parts if p]])
            break
    else:
        if "PYTHONPATH" not in present:
            parts = [cfg.bootstrap_dir, *[p for p in image_pythonpath.split(":") if p and p != cfg.bootstrap_dir]]
            env.append({"name": "PYTHONPATH", "value": ":".join(parts)})


def inject(pod: dict[str, Any], cfg: InjectionConfig, *, namespace_opted_in: bool = False) -> dict[str, Any] | None:
    """The pod with the sidecar added, or None: not opted in, already injected, or nothing to inject into.
    `namespace_opted_in`: the pod's namespace carries the opt-in label (then only a pod label
    `=false` keeps the sidecar out)."""
    wanted = opted_in(pod, cfg) or (namespace_opted_in and not opted_out(pod, cfg))
    if not wanted or already_injected(pod):
        return None
    out = copy.deepcopy(pod)
    spec = out.setdefault("spec", {})
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    if not containers:
        return None
    volumes = spec.setdefault("volumes", [])
    if not any(isinstance(v, dict) and v.get("name") == names.SIDECAR_VOLUME for v in volumes):
        volumes.append({"name": names.SIDECAR_VOLUME, "emptyDir": {}})
    if cfg.operator_identity and not any(isinstance(v, dict) and v.get("name") == names.SIDECAR_TOKEN_VOLUME
                                         for v in volumes):
        volumes.append(token_volume(cfg))
    mount = {"name": names.SIDECAR_VOLUME, "mountPath": cfg.mount_path}
    image_pythonpath = str(((out.get("metadata") or {}).get("annotations") or {}).get(names.ANN_PYTHONPATH) or "")
    for trainer in _trainers(containers):
        _add_env(trainer, cfg, image_pythonpath)
        mounts = trainer.setdefault("volumeMounts", [])
        if not any(isinstance(m, dict) and m.get("name") == names.SIDECAR_VOLUME for m in mounts):
            mounts.append(dict(mount))
        trainer["terminationMessagePolicy"] = "FallbackToLogsOnError"
    sidecar = sidecar_container(cfg, schedule_key(out))
    if cfg.native:
        spec.setdefault("initContainers", []).append(sidecar)
    else:
        spec["containers"].append(sidecar)
    meta = out.setdefault("metadata", {})
    annotations = meta.setdefault("annotations", {})
    annotations[names.ANN_INJECTED] = "native-sidecar" if cfg.native else "container"
    if namespace_opted_in:
        # The pod then carries the label like a pod opted in by hand: the PodMonitor scrapes it.
        meta.setdefault("labels", {})[cfg.inject_label[0]] = cfg.inject_label[1]
    return out


def polled_pod(body: dict[str, Any], cfg: InjectionConfig | None) -> tuple[PodInfo, str | None]:
    """The pod as the operator polls it, and why its sidecar is not trusted (None: it is). With the webhook
    on (`cfg`), a `frscope` port not served by the sidecar as injected is dropped: no endpoint."""
    pod = pod_info(body)
    if cfg is None or pod.sidecar_port is None:
        return pod, None
    why = sidecar_as_injected(body, cfg)
    return (pod, None) if why is None else (replace(pod, sidecar_port=None), why)


def mutate(body: dict[str, Any], cfg: InjectionConfig, *, namespace_opted_in: bool = False) -> dict[str, Any] | None:
    """`inject()` that never raises (the webhook fails open)."""
    try:
        return inject(body, cfg, namespace_opted_in=namespace_opted_in)
    except Exception:
        meta = body.get("metadata") or {}
        log.exception("sidecar injection failed for pod %s/%s; admitting it unchanged",
                      meta.get("namespace"), meta.get("name") or meta.get("generateName"))
        return None
