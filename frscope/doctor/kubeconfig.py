"""Where the API server is and how to authenticate, as kubectl would: the `kubernetes` package's own loader.

Everything a kubeconfig can say comes through `kubernetes.config`: `KUBECONFIG=a:b` lists, merged as kubectl
merges them (the first file to name a cluster, context or user wins; a context in one file may name a user
of another); `token`/`tokenFile`; client certificates (files or data); exec plugins (EKS `aws eks get-token`,
GKE `gke-gcloud-auth-plugin`, AKS `kubelogin`: a token or a client certificate, run again at expiry);
auth-provider `oidc` (and `gcp` where google-auth is installed). With no kubeconfig file at all, inside a pod,
the pod's service account (in-cluster: its token re-read as the kubelet rotates it).

doctor keeps its own HTTP client (`operator.kube.KubeClient` on aiohttp); only the server, the TLS settings
and the credentials are taken from the loaded `kubernetes.client.Configuration`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # kopf depends on PyYAML; its stubs are not installed
from kubernetes.client.configuration import Configuration
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    SERVICE_HOST_ENV_NAME,
    SERVICE_TOKEN_FILENAME,
    InClusterConfigLoader,
)
from kubernetes.config.kube_config import load_kube_config

from frscope.operator.kube.credentials import BearerAuth

IN_CLUSTER = "in-cluster"


class KubeconfigError(Exception):
    """The kubeconfig is missing or names no usable cluster or credentials."""


@dataclass(frozen=True)
class ClusterAccess:
    server: str
    ssl_context: ssl.SSLContext | bool
    auth: BearerAuth
    context: str  # the kubeconfig context, or IN_CLUSTER
    proxy: str | None = None
    warnings: list[str] = field(default_factory=list)  # what doctor cannot honour, said before the checks


class ConfigurationToken:
    """The bearer token of a loaded Configuration, asked anew for every request: the package's refresh hook
    runs the exec plugin again once its credential expired, and re-reads an in-cluster token file."""

    def __init__(self, configuration: Any) -> None:
        self._configuration = configuration
        self._last: str | None = None

    def token(self) -> str | None:
        try:
            settings = self._configuration.auth_settings().get("BearerToken") or {}
        except Exception as e:  # a refresh that failed (an OIDC issuer down): the last token, refused or not
            logging.getLogger(__name__).warning("refreshing the kubeconfig's credentials failed: %s", e)
            return self._last
        value = settings.get("value")
        if not value:
            return None
        scheme, _, credential = str(value).partition(" ")
        self._last = credential.strip() or None if scheme.lower() == "bearer" else None
        return self._last

    def reload(self) -> bool:
        return False  # the package refreshes on expiry (token()); a refused token stays refused


def kubeconfig_files(path: Path | None) -> str:
    """The kubeconfig list to load: --kubeconfig, else $KUBECONFIG (a `:`-separated list), else ~/.kube/config."""
    if path is not None:
        return str(path)
    return os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


@contextlib.contextmanager
def _logged_errors() -> Iterator[list[str]]:
    """The package logs a failing exec plugin (`logging.error`) and goes on without credentials: keep those
    lines, to name the cause instead of a bare 401 later, and keep them off stderr."""
    errors: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            errors.append(record.getMessage().strip())

    handler = Keep(logging.ERROR)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield errors
    finally:
        root.removeHandler(handler)


def _ssl_context(configuration: Any) -> ssl.SSLContext | bool:
    if not configuration.verify_ssl:
        return False
    try:
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
        if configuration.cert_file and configuration.key_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
    except (OSError, ssl.SSLError) as e:
        raise KubeconfigError(f"the kubeconfig's certificates cannot be used: {e}") from e
    return context


def _access(configuration: Any, context: str, errors: list[str]) -> ClusterAccess:
    auth = ConfigurationToken(configuration)
    has_token = auth.token() is not None
    has_certificate = bool(configuration.cert_file and configuration.key_file)
    if not has_token and not has_certificate:
        value = (configuration.auth_settings().get("BearerToken") or {}).get("value") or ""
        if str(value).lower().startswith("basic "):
            raise KubeconfigError(f"context {context!r} authenticates with a username and password, which "
                                  "Kubernetes no longer accepts (1.19+): use a token, certificate or exec plugin")
        if errors:
            raise KubeconfigError(f"context {context!r}: its credentials could not be had: {'; '.join(errors)}")
    server = str(configuration.host or "")
    if not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"context {context!r} names no API server")
    warnings = []
    if getattr(configuration, "tls_server_name", None):
        warnings.append(f"context {context!r}: tls-server-name {configuration.tls_server_name!r} is not honoured: "
                        f"the server certificate is checked against {server}")
    return ClusterAccess(server, _ssl_context(configuration), auth, context,
                         proxy=getattr(configuration, "proxy", None) or None, warnings=warnings)


def in_cluster(token_file: str = SERVICE_TOKEN_FILENAME, ca_file: str = SERVICE_CERT_FILENAME,
               environ: Any = os.environ) -> ClusterAccess:
    """The pod's service account: KUBERNETES_SERVICE_HOST/PORT, its token and the cluster's CA."""
    configuration = Configuration()
    try:
        loader: Any = InClusterConfigLoader  # the package's config modules are untyped
        loader(token_filename=token_file, cert_filename=ca_file, try_refresh_token=True,
               environ=environ).load_and_set(configuration)
    except (ConfigException, OSError) as e:
        raise KubeconfigError(f"in-cluster configuration (the pod's service account): {e}") from e
    return _access(configuration, IN_CLUSTER, [])


def _documents(files: list[str]) -> list[dict[str, Any]]:
    """Each file's YAML, to pick the context by kubectl's rule: the first file that sets current-context decides
    (the package would take the last one)."""
    documents = []
    for file in files:
        document = yaml.safe_load(Path(file).expanduser().read_text())
        documents.append(document if isinstance(document, dict) else {})
    return documents


def _named(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    """The first entry called `name` among the files' `kind` lists (kubectl's rule: the first file wins)."""
    for document in documents:
        for entry in document.get(kind) or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                return entry
    return None


def _check_names(files: str, documents: list[dict[str, Any]], name: str) -> None:
    """The context and what it names exist in some file: a user missing from a merged list would otherwise
    make every request anonymous, and fail each check instead of saying why."""
    entry = _named(documents, "contexts", name)
    if entry is None:
        raise KubeconfigError(f"the kubeconfig {files} has no context named {name!r}")
    found = entry.get("context")
    context: dict[str, Any] = found if isinstance(found, dict) else {}
    for key, kind in (("cluster", "clusters"), ("user", "users")):
        if context.get(key) and _named(documents, kind, str(context[key])) is None:
            raise KubeconfigError(f"context {name!r} names {key} {context[key]!r}, which no file of the "
                                  f"kubeconfig {files} defines")
    cluster = _named(documents, "clusters", str(context.get("cluster", "")))
    if cluster is None or not isinstance(cluster.get("cluster"), dict) or not cluster["cluster"].get("server"):
        raise KubeconfigError(f"context {name!r} names no API server (its cluster has no server)")


def load(path: Path | None = None, context: str | None = None, *, environ: Any = os.environ,
         token_file: str = SERVICE_TOKEN_FILENAME, ca_file: str = SERVICE_CERT_FILENAME) -> ClusterAccess:
    """The cluster of `context` (default: the current one) in the kubeconfig list; in a pod with no kubeconfig
    file, its service account."""
    files = kubeconfig_files(path)
    present = [p for p in files.split(os.pathsep) if p and Path(p).expanduser().is_file()]
    if not present:
        if path is None and environ.get(SERVICE_HOST_ENV_NAME):
            return in_cluster(token_file, ca_file, environ)
        raise KubeconfigError(f"cannot read the kubeconfig {files}: no such file (and not in a pod: "
                              f"{SERVICE_HOST_ENV_NAME} is not set)")
    configuration = Configuration()
    try:
        with _logged_errors() as errors:
            documents = _documents(present)
            name = context or next((str(d["current-context"]) for d in documents if d.get("current-context")), None)
            if not name:
                raise KubeconfigError(f"the kubeconfig {files} has no current-context")
            _check_names(files, documents, name)
            load_kube_config(config_file=files, context=name,  # type: ignore[no-untyped-call]
                             client_configuration=configuration, persist_config=False)
    except ConfigException as e:
        raise KubeconfigError(f"the kubeconfig {files}: {e}") from e
    except OSError as e:
        raise KubeconfigError(f"cannot read the kubeconfig {files}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise KubeconfigError(f"the kubeconfig {files} is not YAML: {e}") from e
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # YAML that is not a kubeconfig
        raise KubeconfigError(f"the kubeconfig {files} is not a usable kubeconfig: {type(e).__name__}: {e}") from e
    return _access(configuration, str(name), errors)
