"""Every alert of the chart's PrometheusRule, unit-tested by the real `promtool test rules` (Debian's prometheus
package) against the rules helm renders: the test files in tests/e2e/promtool/ give each alert series that
must fire it (with its labels and annotations as a receiver gets them) and series that must not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

try:  # tests/e2e is a plain directory today; keep working if it becomes a package
    from tests.e2e.chart_tools import Helm, objects, one, rules_file
except ModuleNotFoundError:
    from chart_tools import Helm, objects, one, rules_file

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PROMTOOL_TESTS = Path(__file__).parent / "promtool"


@pytest.fixture(scope="module")
def helm(testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(testenv_bin_dir / "helm", tmp_path_factory.mktemp("helm-home"))


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make deps-apt` installs Debian's prometheus package", pytrace=False)
    return promtool


def _alerts(helm: Helm) -> set[str]:
    rule = one(objects(helm, "install"), "PrometheusRule")
    return {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}


def test_every_alert_has_a_promtool_test_that_fires_it(helm: Helm) -> None:
    tested = "\n".join(f.read_text() for f in sorted(PROMTOOL_TESTS.glob("*.yaml")))
    alerts = _alerts(helm)
    assert alerts == {"FrscopeOperatorDown", "FrscopePublishErrors", "FrscopeCollectiveStalled",
                      "FrscopeDiagnosisMade", "FrscopeSidecarDown"}
    for alert in alerts:
        assert f"alertname: {alert}\n        exp_alerts:\n          - exp_labels" in tested, f"{alert} never fires"
        assert f"alertname: {alert}\n        exp_alerts: []" in tested, f"{alert} is never shown quiet"


@pytest.mark.parametrize("test_file", sorted(p.name for p in PROMTOOL_TESTS.glob("*.yaml")))
def test_promtool_test_rules(helm: Helm, test_file: str, tmp_path: Path) -> None:
    (tmp_path / "frscope-rules.yaml").write_text(rules_file(objects(helm, "install")))
    shutil.copy(PROMTOOL_TESTS / test_file, tmp_path / test_file)
    proc = subprocess.run([_promtool(), "test", "rules", test_file], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_a_broken_expectation_fails_promtool(helm: Helm, tmp_path: Path) -> None:
    """The tests above can fail: the same file with one expected label changed is refused."""
    (tmp_path / "frscope-rules.yaml").write_text(rules_file(objects(helm, "install")))
    text = (PROMTOOL_TESTS / "frscope_rules_test.yaml").read_text()
    broken = text.replace("training_job: demo, job_kind: pytorchjob, pg: \"0\"", "training_job: demo, "
                          "job_kind: pytorchjob, pg: \"1\"", 1)
    assert broken != text
    (tmp_path / "broken_test.yaml").write_text(broken)
    proc = subprocess.run([_promtool(), "test", "rules", "broken_test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "FrscopeCollectiveStalled" in proc.stdout + proc.stderr
