"""The Grafana dashboard JSON shipped in the chart (charts/frscope/files/frscope-dashboard.json): its
shape, variables and queries. That every query returns data from a real Prometheus that scraped a real
sidecar beside a real hung job: tests/e2e/test_chart_promql.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(30)

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "frscope" / "files" / "frscope-dashboard.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
# Collective metrics without a `pg` label (docs/sidecar.md): durations by op, time in collectives by rank.
PER_RANK_ONLY = ("frscope_collective_duration_seconds_bucket", "frscope_collective_wait_seconds_total")
OPERATOR_PREFIXES = ("frscope_operator_", "frscope_node_")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Panels that query Prometheus (not rows, not text)."""
    return [p for p in dashboard["panels"] if p["type"] not in ("row", "text")]


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p["targets"]]


def test_stable_uid_and_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "frscope-collectives"
    assert "id" not in dashboard  # Grafana assigns it; a fixed id breaks imports into other instances
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"


def test_filter_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "job", "pg", "op", "operator_url"]
    for name in ("namespace", "job", "pg", "op"):
        var = variables[name]
        assert var["type"] == "query"
        assert var["datasource"] == DS
        assert var["multi"] and var["includeAll"] and var["allValue"] == ".*"
        assert var["query"]["query"].startswith("label_values(")
    assert variables["op"]["query"]["query"].endswith(", op)")
    assert variables["job"]["query"]["query"].endswith(", training_job)")
    assert variables["pg"]["query"]["query"].endswith(", pg)")


def test_every_panel_and_query_uses_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard):
        assert panel["datasource"] == DS, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DS, panel["title"]


def test_ranges_use_rate_interval(dashboard: dict[str, Any]) -> None:
    for expr in _exprs(dashboard):
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window in ("$__rate_interval", "$__range"), expr
        if re.search(r"\b(rate|irate)\(", expr):
            assert "[$__rate_interval]" in expr, expr


def test_sidecar_queries_follow_the_filters(dashboard: dict[str, Any]) -> None:
    """Sidecar metrics get namespace/pod/training_job from the PodMonitor and carry rank/pg/op themselves;
    the operator's metrics carry no job labels (bounded), so they are not filtered by job, except its
    per-job gauges (`frscope_operator_job_*`: the diagnosis, series removed with the job; the live
    window's --perf numbers, removed with the window), which their panels filter by."""
    for expr in _exprs(dashboard):
        for metric, selector in re.findall(r"(frscope_\w+)(?:\{([^}]*)\})?", expr):
            # The operator's own (and its node ledger's, by node) carry no job labels.
            if metric.startswith(OPERATOR_PREFIXES) and not metric.startswith("frscope_operator_job_"):
                assert not selector, expr
                continue
            assert 'namespace=~"$namespace"' in selector, expr
            assert 'training_job=~"$job"' in selector, expr
            if metric.startswith("frscope_collective_") and metric not in PER_RANK_ONLY:
                assert 'pg=~"$pg"' in selector, expr
        if "frscope_collectives_total" in expr or "_duration_seconds_bucket" in expr:
            assert 'op=~"$op"' in expr, expr


@pytest.mark.parametrize(
    ("metric", "what"),
    [
        ("frscope_collective_last_completed_seq", "progress of the last completed sequence id per rank"),
        ("frscope_collective_inflight_age_seconds", "in-flight age by rank"),
        ("frscope_collective_stalled", "stalled ranks"),
        ("frscope_collectives_total", "collective rate by op"),
        ("_duration_seconds_bucket", "durations by op"),
        ("frscope_operator_job_diagnosis", "diagnosed jobs, following $namespace/$job"),
        ("frscope_collective_wait_seconds_total", "step-boundary lateness per rank"),
        ("frscope_node_suspicion", "the node ledger's suspicion per node"),
        ("frscope_node_incidents_total", "incidents on nodes by evidence class"),
        ("frscope_operator_job_perf_collective_seconds", "where the time goes: wait vs transfer (live window)"),
        ("frscope_operator_job_perf_rank_cost_seconds", "the ranks that cost the job most (live window)"),
    ],
)
def test_required_panels_exist(dashboard: dict[str, Any], metric: str, what: str) -> None:
    assert any(metric in expr for expr in _exprs(dashboard)), what


def test_layout(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
    for panel in _panels(dashboard):
        assert panel["description"], panel["title"]
        assert {t["refId"] for t in panel["targets"]} == {chr(65 + n) for n in range(len(panel["targets"]))}


def test_links_to_the_operator_ui_and_kubectl_for_the_selected_job(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["operator_url"]["type"] == "textbox"
    urls = [link["url"] for link in dashboard["links"]]
    assert "${operator_url}/ui/jobs/${namespace}/${job}" in urls and "${operator_url}/ui/" in urls
    [text] = [p for p in dashboard["panels"] if p["type"] == "text"]
    assert "kubectl get frr -n $namespace -l frscope.io/job=$job" in text["options"]["content"]
    assert text["description"]


def test_perf_panels_say_when_they_are_empty(dashboard: dict[str, Any]) -> None:
    """The live window exists only while someone has the job's page open: the panels say so."""
    for metric in ("frscope_operator_job_perf_collective_seconds", "frscope_operator_job_perf_rank_cost_seconds"):
        [panel] = [p for p in _panels(dashboard) if any(metric in t["expr"] for t in p["targets"])]
        assert "page" in panel["fieldConfig"]["defaults"]["noValue"] or "live window" in panel["fieldConfig"][
            "defaults"]["noValue"]
        assert "page open" in panel["description"] and panel["fieldConfig"]["defaults"]["unit"] == "s"


def test_durations_panel_says_why_it_is_empty(dashboard: dict[str, Any]) -> None:
    [panel] = [p for p in _panels(dashboard) if any("_duration_seconds_bucket" in t["expr"] for t in p["targets"])]
    assert "TORCH_NCCL_ENABLE_TIMING=1" in panel["fieldConfig"]["defaults"]["noValue"]
    assert "TORCH_NCCL_ENABLE_TIMING=1" in panel["description"]


def test_lateness_panel_compares_ranks_across_pods_in_promql(dashboard: dict[str, Any]) -> None:
    """Each sidecar counts only its own ranks' time in collectives; the comparison with the job's other
    ranks (on other pods) is the query's: the job's highest minus each rank's, per job, one bar per rank."""
    [panel] = [p for p in _panels(dashboard) if any("frscope_collective_wait_seconds_total" in t["expr"]
                                                    for t in p["targets"])]
    [target] = panel["targets"]
    expr = re.sub(r"\s+", " ", target["expr"])
    job = "namespace, job_kind, training_job"
    assert f"max by ({job}) (increase(" in expr
    assert f"- on ({job}) group_right () max by ({job}, rank) (increase(" in expr
    assert expr.count("[$__range]") == 2 and target["instant"] and not target["range"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"
    assert "TORCH_NCCL_ENABLE_TIMING=1" in panel["description"] and "gloo" in panel["description"]


def test_every_per_rank_panel_draws_a_bounded_number_of_ranks(dashboard: dict[str, Any]) -> None:
    """A panel with one series per rank would draw 8,192 lines for an 8,192-rank job (and make Prometheus
    return them all): every query that keeps `rank` in its result goes through topk/bottomk."""
    per_rank = [(p["title"], t["expr"]) for p in _panels(dashboard) for t in p["targets"]
                if re.search(r"by \([^)]*\brank\b", t["expr"]) and p["type"] != "stat"]
    assert len(per_rank) >= 5, per_rank
    for title, expr in per_rank:
        assert re.search(r"\b(topk|bottomk)\((\d+),", expr), f"{title}: {expr}"
        assert int(re.search(r"\b(?:topk|bottomk)\((\d+),", expr).group(1)) <= 20, title  # type: ignore[union-attr]
