"""`frscope doctor` on every release of the Kubernetes version matrix (test_kube_versions.py says how
the matrix runs): the chart installed by the real helm, a good setup passes every check, the
`kubernetes-version` check among them (frscope/doctor/versions.py lists the tested releases). A module
of its own: its chart install must be the only one in the cluster, and test_kube_versions.py keeps
another installed while its tests run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e import kube_matrix
    from tests.e2e.test_chart_install import helm
    from tests.e2e.test_doctor_e2e import good, test_a_good_setup_passes_every_check, training_namespace
except ModuleNotFoundError:
    import kube_matrix
    from test_chart_install import helm
    from test_doctor_e2e import good, test_a_good_setup_passes_every_check, training_namespace

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

# The fixtures and the test above, collected here once per release.
__all__ = ["good", "helm", "test_a_good_setup_passes_every_check", "training_namespace"]

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.kube_matrix,
    pytest.mark.timeout(300),
    pytest.mark.parametrize("kube_release", kube_matrix.other_releases(), indirect=True, scope="session"),
]


@pytest.fixture(scope="module")
def kube(kube_release: ControlPlane) -> ControlPlane:
    """This module's tests run on the release they are parametrized with."""
    return kube_release
