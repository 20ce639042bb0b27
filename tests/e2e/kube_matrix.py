"""The Kubernetes releases the API-server tier runs against (the version matrix, docs/testenv.md).

The default release is the one testenv/go.mod requires: every e2e test and the node tier use it. Each
other release has its own module, testenv/kube/<version>/go.mod (`testenv/update --matrix vX.Y.Z`), and
its own cache key (`testenv/build --version X.Y.Z`). The list is read from the repository, so adding a
release is adding its module; nothing here names a version.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TESTENV = Path(__file__).resolve().parents[2] / "testenv"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def default_release() -> str:
    """The release testenv/go.mod requires, e.g. "1.36.3"."""
    found = re.search(r"^require k8s\.io/kubernetes v(\d+\.\d+\.\d+)", (TESTENV / "go.mod").read_text(), re.M)
    if found is None:
        raise RuntimeError(f"no `require k8s.io/kubernetes` in {TESTENV / 'go.mod'}")
    return found.group(1)


def releases() -> tuple[str, ...]:
    """Every release of the matrix, oldest first: the default one and each testenv/kube/<version>."""
    kube = TESTENV / "kube"
    others = {d.name for d in kube.iterdir() if (d / "go.mod").is_file()} if kube.is_dir() else set()
    return tuple(sorted(others | {default_release()}, key=_key))


def oldest_release() -> str:
    return releases()[0]


def other_releases() -> tuple[str, ...]:
    """The releases the matrix modules run on: all but the default, whose run of the same tests is in
    their own modules (test_chart_install.py, test_operator_e2e.py, ...)."""
    return tuple(v for v in releases() if v != default_release())


def must_be_built(version: str) -> bool:
    """The releases `make test` builds and CI must run (never skip): the default one and the oldest.
    The others run where they are built (`make test-kube-matrix` builds them) and are skipped otherwise."""
    return version == default_release() or (version == oldest_release() and os.environ.get("CI") == "true")
