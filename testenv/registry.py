"""The node's OCI registry: the CNCF registry (distribution v3, built by testenv/build-registry) on the
node's address, over TLS with a CA of its own that containerd trusts through its hosts directory
(`certs.d/<host>/hosts.toml`, `ca = ...`), the way a cluster trusts a private registry. testenv/node.py
starts it before the kubelet and pushes what a release publishes: the frscope image (`buildah push`, from
the archive testenv/build-images wrote) and the chart (`helm package` + `helm push oci://`). The kubelet
then pulls the image from it and helm installs the chart from it.

Why TLS and not a plain-HTTP "insecure" mirror: containerd, helm and buildah all refuse plain HTTP unless
told otherwise per host (`plain-http`, `--plain-http`, `--tls-verify=false`), and a cluster that pulls
its operator's image from a registry does it over TLS with a CA it trusts; the test then exercises the
same trust settings a user configures. No authentication: the registry listens only on the node's
bridge, which nothing outside this machine reaches (docs/testenv.md, "The OCI registry").

Standard library only, like node.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PORT = 5000
IMAGE_PATH = "frscope/frscope"  # the image's repository inside the registry
CHART_PATH = "charts"  # `helm push` appends the chart's name: oci://<host>/charts/frscope
# testenv/build-images' archive of the repository's Dockerfile image (frscope-<hash>.tar): pushed, not imported.
FRSCOPE_ARCHIVE_PREFIX = "frscope-"


class RegistryError(Exception):
    """The registry did not start, or a push failed."""


@dataclass
class Registry:
    """The registry on the node: where it is, the CA that signs its certificate, what was pushed."""

    host: str  # "10.213.0.1:5000"
    ca_file: Path
    workdir: Path
    image: str = ""  # "<host>/frscope/frscope:<the chart's appVersion>", once pushed
    image_digest: str = ""  # the manifest digest the push wrote ("sha256:...")
    chart_version: str = ""
    chart_digest: str = ""
    timings: dict[str, float] | None = None

    @property
    def url(self) -> str:
        return f"https://{self.host}"

    @property
    def image_repository(self) -> str:
        return f"{self.host}/{IMAGE_PATH}"

    @property
    def chart_ref(self) -> str:
        return f"oci://{self.host}/{CHART_PATH}/frscope"

    def get(self, path: str, accept: str = "") -> tuple[dict[str, str], Any]:
        """GET a registry API path over TLS verified with the registry's CA: (headers, JSON body)."""
        request = urllib.request.Request(self.url + path, headers={"Accept": accept} if accept else {})
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with urllib.request.urlopen(request, context=context, timeout=10) as r:
            return dict(r.headers), json.loads(r.read() or b"null")


def _openssl(cluster: Any, *args: str, cwd: Path, sans: str = "") -> None:
    cluster._openssl(*args, cwd=cwd, **({"sans": sans} if sans else {}))


def prepare(cluster: Any, workdir: Path, address: str, port: int = PORT) -> tuple[Registry, Path]:
    """The registry's CA and serving certificate (for `address`), and containerd's hosts directory that
    trusts it. Returns the registry (not started) and the hosts directory for containerd's
    `config_path`. `cluster`: testenv/cluster.py (its openssl helpers)."""
    pki_dir = workdir / "registry" / "pki"
    pki_dir.mkdir(parents=True)
    (pki_dir / "openssl.cnf").write_text(cluster._OPENSSL_CNF)
    _openssl(cluster, "req", "-x509", "-config", "openssl.cnf", "-extensions", "ca", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
             "-subj", "/CN=frscope-testenv-registry-ca", cwd=pki_dir)
    cluster.Pki(pki_dir).leaf("registry", "/CN=frscope-testenv-registry", server_sans=(f"IP:{address}",))
    host = f"{address}:{port}"
    registry = Registry(host=host, ca_file=pki_dir / "ca.crt", workdir=workdir / "registry")
    hosts_dir = workdir / "registry" / "certs.d"
    (hosts_dir / host).mkdir(parents=True)
    (hosts_dir / host / "hosts.toml").write_text(
        f'server = "https://{host}"\n\n'
        f'[host."https://{host}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
        f'  ca = "{registry.ca_file}"\n'
    )
    # buildah's --cert-dir takes every *.crt in it as a CA: the CA alone.
    (registry.workdir / "trust").mkdir()
    shutil.copy2(registry.ca_file, registry.workdir / "trust" / "ca.crt")
    return registry, hosts_dir


def start(registry: Registry, cluster: Any, spawn: Any, binary: Path, timeout: float) -> None:
    """Run the registry with `spawn(name, args, env)` (the node's: stopped with it), which returns a
    testenv/cluster.py process; returns when /v2/ answers."""
    config = {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text"},
        "storage": {"filesystem": {"rootdirectory": str(registry.workdir / "data")}, "delete": {"enabled": True}},
        "http": {
            "addr": registry.host,
            "tls": {"certificate": str(registry.ca_file.parent / "registry.crt"),
                    "key": str(registry.ca_file.parent / "registry.key")},
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
        "health": {"storagedriver": {"enabled": True, "interval": "10s", "threshold": 3}},
    }
    config_path = registry.workdir / "config.yml"
    config_path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    # Its traces go to an OTLP collector on localhost:4318 unless told otherwise: there is none.
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none"}
    proc = spawn("registry", [str(binary), "serve", str(config_path)], env)

    def serving() -> bool:
        headers, _ = registry.get("/v2/")
        return headers.get("Docker-Distribution-Api-Version") == "registry/2.0"

    cluster._wait_until(f"the registry at {registry.url}/v2/", proc, serving, timeout)


def _run(args: list[str], what: str, timeout: float, env: dict[str, str] | None = None) -> tuple[str, str]:
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RegistryError(f"{what}: {' '.join(args)} exited {proc.returncode}: "
                            f"{(proc.stderr.strip() or proc.stdout.strip())[-2000:]}")
    return proc.stdout, proc.stderr


def chart_field(chart_dir: Path, name: str) -> str:
    """A top-level scalar of Chart.yaml (version, appVersion), without a YAML parser."""
    match = re.search(rf"^{name}:\s*\"?([^\"\s]+)\"?\s*$", (chart_dir / "Chart.yaml").read_text(), re.MULTILINE)
    if match is None:
        raise RegistryError(f"{chart_dir / 'Chart.yaml'} has no {name}")
    return match.group(1)


def push_image(registry: Registry, archive: Path, tag: str, timeout: float = 600) -> None:
    """`buildah push` of an image archive to <host>/frscope/frscope:<tag>. buildah pushes from its own
    storage: the archive is pulled into a throwaway one first (vfs: nothing to mount), removed after."""
    storage = registry.workdir / "buildah"
    buildah = ["buildah", "--root", str(storage / "root"), "--runroot", str(storage / "run"), "--storage-driver", "vfs"]
    image = f"{registry.image_repository}:{tag}"
    digest_file = registry.workdir / "image.digest"
    try:
        pulled, _ = _run([*buildah, "pull", "--quiet", f"docker-archive:{archive}"], "buildah pull", timeout)
        image_id = pulled.split()[-1]
        _run([*buildah, "push", "--quiet", "--cert-dir", str(registry.workdir / "trust"), "--digestfile",
              str(digest_file), image_id, f"docker://{image}"], "buildah push", timeout)
    finally:
        subprocess.run([*buildah, "rmi", "--all", "--force"], capture_output=True, check=False, timeout=120)
        shutil.rmtree(storage, ignore_errors=True)
    registry.image = image
    registry.image_digest = digest_file.read_text().strip()


def push_chart(registry: Registry, helm: Path, chart_dir: Path, timeout: float = 120) -> None:
    """`helm package` the chart and `helm push` it to oci://<host>/charts (helm trusts the registry's CA
    by --ca-file; its config and cache stay in the registry's work dir)."""
    home = registry.workdir / "helm"
    env = {**os.environ, "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data"),
           "HELM_REGISTRY_CONFIG": str(home / "registry.json")}
    packaged = registry.workdir / "chart"
    _run([str(helm), "package", str(chart_dir), "--destination", str(packaged)], "helm package", timeout, env)
    [tgz] = packaged.glob("*.tgz")
    out = "".join(_run([str(helm), "push", str(tgz), f"oci://{registry.host}/{CHART_PATH}", "--ca-file",
                        str(registry.ca_file)], "helm push", timeout, env))
    # helm says "Pushed: <ref>:<version>" and "Digest: sha256:..." (on stderr).
    registry.chart_version = chart_field(chart_dir, "version")
    _, manifest = registry.get(f"/v2/{CHART_PATH}/frscope/manifests/{registry.chart_version}",
                               accept="application/vnd.oci.image.manifest.v1+json")
    if manifest.get("config", {}).get("mediaType") != "application/vnd.cncf.helm.config.v1+json":
        raise RegistryError(f"helm push left no chart at {registry.chart_ref}:{registry.chart_version}: {out}")
    digest = re.search(r"Digest: (sha256:[0-9a-f]{64})", out)
    registry.chart_digest = digest.group(1) if digest else ""


def publish(registry: Registry, frscope_archive: Path, helm: Path, chart_dir: Path) -> None:
    """Push the image (tagged with the chart's appVersion, so the chart's default tag names it) and the
    chart, as a release does; the times go to `registry.timings`."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    push_image(registry, frscope_archive, chart_field(chart_dir, "appVersion"))
    timings["image"] = time.monotonic() - started
    started = time.monotonic()
    push_chart(registry, helm, chart_dir)
    timings["chart"] = time.monotonic() - started
    registry.timings = timings
