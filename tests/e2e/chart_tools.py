"""Helpers shared by the chart tests: run the helm that testenv built, render charts/frscope, pick
objects out of the rendered manifests. No Kubernetes client library: helm, kubectl and PyYAML only."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "frscope"
CI_VALUES = CHART / "ci"

# The values files the tests render: name -> files (in order).
VALUES_SETS: dict[str, tuple[Path, ...]] = {
    "defaults": (),
    "all-on": (CI_VALUES / "all-on-values.yaml",),
    "monitoring-off": (CI_VALUES / "monitoring-off-values.yaml",),
    "namespaced": (CI_VALUES / "namespaced-values.yaml",),
    "install": (CI_VALUES / "install-values.yaml",),
}

MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


@dataclass(frozen=True)
class Helm:
    """The helm binary from testenv, with its cache/config/data homes in a scratch directory."""

    binary: Path
    home: Path
    kubeconfig: Path | None = None

    def env(self) -> dict[str, str]:
        env = {
            "PATH": f"{self.binary.parent}:/usr/bin:/bin",
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def with_kubeconfig(self, kubeconfig: Path) -> Helm:
        return Helm(self.binary, self.home, kubeconfig)


def values_args(values: str | Sequence[Path], sets: Iterable[str] = ()) -> list[str]:
    files = VALUES_SETS[values] if isinstance(values, str) else tuple(values)
    args: list[str] = []
    for f in files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    return args


def render(
    helm: Helm,
    values: str | Sequence[Path] = "defaults",
    *,
    sets: Iterable[str] = (),
    release: str = "frs",
    namespace: str = "frscope-system",
    extra: Sequence[str] = (),
) -> str:
    return helm.run(
        "template", release, str(CHART), "--namespace", namespace, *values_args(values, sets), *extra
    ).stdout


def parse(manifests: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifests) if doc]


def objects(
    helm: Helm,
    values: str | Sequence[Path] = "defaults",
    *,
    sets: Iterable[str] = (),
    release: str = "frs",
    namespace: str = "frscope-system",
) -> list[dict[str, Any]]:
    return parse(render(helm, values, sets=sets, release=release, namespace=namespace))


def of_kind(objs: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [dict(o) for o in objs if o["kind"] == kind]


def one(objs: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in of_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def rules_file(objs: Iterable[Mapping[str, Any]]) -> str:
    """The rendered PrometheusRule's groups as a plain Prometheus rule file (for promtool, prometheus)."""
    rule = one(objs, "PrometheusRule")
    return str(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
