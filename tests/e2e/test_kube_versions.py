"""The Kubernetes version matrix of the API-server tier: what frscope needs from the API server, run
against every release of tests/e2e/kube_matrix.py besides the default one (each testenv/kube/<version>;
1.30.14 is the oldest the chart's kubeVersion admits). Each release's etcd, kube-apiserver,
kube-controller-manager and kubectl are its own (testenv/build --version); helm is the same. The
default release (1.36.3) runs these tests in their own modules.

The tests are the ones that prove the release works for frscope, taken from their own modules and run
here once per release (`kube` is the release's control plane in this module):
- the control plane is that release, and the PyTorchJob CRD's status subresource, pruning and
  printer columns behave as frscope relies on (test_control_plane.py);
- the chart installs with the real helm (its kubeVersion checked against the server), every object is
  stored, an upgrade keeps the webhook certificate, the webhook fails open, the operator's RBAC is
  exactly what it needs, a namespaced install and the real operator with it (test_chart_install.py);
- the mutating webhook injects the native sidecar through the API server, by pod label and by
  namespace; the operator's client against the server's conflicts, pruning and RBAC; a real hung torch
  job diagnosed into the job's status, its Events and a FlightRecorderReport (test_operator_e2e.py).
`frscope doctor` on each release: test_kube_versions_doctor.py (its chart install must be alone).

A release other than the default is skipped when it is not built, except the oldest under CI=true
(`make test` builds it); `make test-kube-matrix` builds and runs every release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e import kube_matrix
    from tests.e2e.test_chart_install import (
        helm,
        installed,
        test_describe_prints_each_culprit_frame_on_its_own_line,
        test_every_object_is_stored,
        test_namespaced_install_is_limited_to_its_namespaces,
        test_operator_can_do_nothing_beyond,
        test_operator_can_do_what_it_needs,
        test_report_crd_registers,
        test_upgrade_keeps_the_webhook_certificate,
        test_webhook_fails_open_and_ignores_pods_without_the_label,
    )
    from tests.e2e.test_control_plane import (
        test_condition_survives_status_patches_and_unknown_status_field_is_pruned,
        test_versions_are_the_release_everywhere,
    )
    from tests.e2e.test_operator_e2e import (
        chart_rbac,
        namespace,
        operator_kubeconfig,
        report_crd,
        test_a_real_hang_is_diagnosed_into_the_job,
        test_api_client_against_the_real_server,
        test_namespace_opt_in_through_the_charts_webhook_entries,
        test_webhook_injects_the_sidecar_through_the_api_server,
    )
except ModuleNotFoundError:
    import kube_matrix
    from test_chart_install import (
        helm,
        installed,
        test_describe_prints_each_culprit_frame_on_its_own_line,
        test_every_object_is_stored,
        test_namespaced_install_is_limited_to_its_namespaces,
        test_operator_can_do_nothing_beyond,
        test_operator_can_do_what_it_needs,
        test_report_crd_registers,
        test_upgrade_keeps_the_webhook_certificate,
        test_webhook_fails_open_and_ignores_pods_without_the_label,
    )
    from test_control_plane import (
        test_condition_survives_status_patches_and_unknown_status_field_is_pruned,
        test_versions_are_the_release_everywhere,
    )
    from test_operator_e2e import (
        chart_rbac,
        namespace,
        operator_kubeconfig,
        report_crd,
        test_a_real_hang_is_diagnosed_into_the_job,
        test_api_client_against_the_real_server,
        test_namespace_opt_in_through_the_charts_webhook_entries,
        test_webhook_injects_the_sidecar_through_the_api_server,
    )

if TYPE_CHECKING:
    from testenv.cluster import ControlPlane

# The fixtures and tests above, collected here once per release.
__all__ = [
    "chart_rbac", "helm", "installed", "namespace", "operator_kubeconfig", "report_crd",
    "test_a_real_hang_is_diagnosed_into_the_job", "test_api_client_against_the_real_server",
    "test_condition_survives_status_patches_and_unknown_status_field_is_pruned",
    "test_describe_prints_each_culprit_frame_on_its_own_line", "test_every_object_is_stored",
    "test_namespace_opt_in_through_the_charts_webhook_entries",
    "test_namespaced_install_is_limited_to_its_namespaces", "test_operator_can_do_nothing_beyond",
    "test_operator_can_do_what_it_needs", "test_report_crd_registers", "test_upgrade_keeps_the_webhook_certificate",
    "test_versions_are_the_release_everywhere", "test_webhook_fails_open_and_ignores_pods_without_the_label",
    "test_webhook_injects_the_sidecar_through_the_api_server",
]

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.kube_matrix,
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.parametrize("kube_release", kube_matrix.other_releases(), indirect=True, scope="session"),
]


@pytest.fixture(scope="module")
def kube(kube_release: ControlPlane) -> ControlPlane:
    """This module's tests run on the release they are parametrized with."""
    return kube_release


def test_the_control_plane_is_the_release_of_the_parameter(kube: ControlPlane, request: pytest.FixtureRequest) -> None:
    """The tests above really ran on the release in their id: the server and kubectl report it."""
    release = f"v{request.node.callspec.params['kube_release']}"
    assert kube.get_raw("/version")["gitVersion"] == release
    assert kube.kubectl_json("version")["clientVersion"]["gitVersion"] == release
