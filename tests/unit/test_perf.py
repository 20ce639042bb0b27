"""`frscope analyze --perf` (frscope.analysis.perf): where the time goes, on the real straggler recorders
(gloo: creation times only) and, for durations, on the NCCL shape of frscope.testing.synthetic (nobody here has
NCCL with timing on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frscope.analysis.perf import analyze_perf, entry_bytes, size_bucket
from frscope.cli import main
from frscope.records import DumpSet, Entry, GroupInfo, RankDump, load_dumps
from frscope.report.perf import perf_to_dict, render_perf_text
from frscope.testing.synthetic import generate
from tests.synthetic import synthetic_hang

REAL = Path(__file__).parents[1] / "data" / "real"
STRAGGLERS = ["straggler", "straggler-pickle", "steps", "steps-pickle", "steps-6", "steps-6-pickle"]


@pytest.mark.parametrize("fixture", STRAGGLERS)
def test_names_the_straggler_first(fixture: str) -> None:
    perf = analyze_perf(load_dumps([REAL / fixture]))
    assert perf.timing == "creation times" and perf.transfer_ms is None
    top = perf.costs[0]
    assert top.rank == 2
    assert perf.headline.startswith("Rank 2 costs the job most: ")
    # it costs the job several seconds and the others' cost is small beside it
    assert top.cost_ms > 2500
    assert all(c.cost_ms < top.cost_ms / 10 for c in perf.costs[1:])
    # the straggler waits least: the others wait for it
    waited = {c.rank: c.waited_ms for c in perf.costs}
    assert waited[2] == min(waited.values())


def test_every_collective_straggler_costs_its_lateness_each_time() -> None:
    perf = analyze_perf(load_dumps([REAL / "straggler"]))
    top = perf.costs[0]
    assert top.last_count == 20 and top.median_gap_ms is not None and 140 < top.median_gap_ms < 200  # 150 ms sleeps
    assert "150 ms after the next-latest rank" in perf.headline


@pytest.mark.parametrize("fixture", ["none", "jitter", "none-pickle", "jitter-pickle"])
def test_healthy_jobs_blame_no_single_rank(fixture: str) -> None:
    perf = analyze_perf(load_dumps([REAL / fixture]))
    assert perf.headline.startswith(("No rank holds up", "No single rank holds up")), perf.headline
    assert "costs the job most" not in perf.headline
    assert perf.collectives > 0


def test_rows_split_by_group_op_and_size() -> None:
    perf = analyze_perf(load_dumps([REAL / "straggler"]))
    keys = {(r.group, r.op_label, r.size_bucket): r for r in perf.rows}
    row = keys[("0", "ALLREDUCE", "< 1 KiB")]
    assert row.collectives == 20 and row.bytes == 20 * 8 * 4 * 4  # float32 [8, 4]
    assert row.wait_ms > 3 * 2500  # three ranks wait ~150 ms at each of 20
    assert ("1", "BROADCAST", "< 1 KiB") in keys
    assert perf.rows[0] is row  # most time first


def test_durations_split_wait_and_transfer_and_ignore_clock_offsets(tmp_path: Path) -> None:
    truth = generate(tmp_path / "nccl", 16, fmt="json", shape="nccl", scenario="straggler", entries=300)
    dumpset = load_dumps([tmp_path / "nccl"])
    # a host whose clock runs 5 s ahead: creation times shift, durations do not
    for e in dumpset.dumps[3].entries:
        if e.time_created_ns:
            e.time_created_ns += 5_000_000_000
    perf = analyze_perf(dumpset)
    assert perf.timing == "durations"
    assert perf.costs[0].rank == truth.culprit_ranks[0]
    assert 3 not in [c.rank for c in perf.costs[:1]]
    assert perf.transfer_ms is not None and perf.transfer_ms > 0
    assert any(r.bandwidth_gbps for r in perf.rows)


def test_gloo_shape_of_the_synthetic_straggler(tmp_path: Path) -> None:
    truth = generate(tmp_path / "gloo", 16, fmt="json", shape="gloo", scenario="straggler", entries=300)
    perf = analyze_perf(load_dumps([tmp_path / "gloo"]))
    assert perf.timing == "creation times"
    assert perf.costs[0].rank == truth.culprit_ranks[0]


def test_a_hang_has_nothing_in_flight_counted() -> None:
    # the collective every rank is blocked in is not complete: not counted
    dumpset = synthetic_hang(8, 30, culprit=5)
    perf = analyze_perf(dumpset)
    assert perf.collectives == 29


def test_bytes_and_buckets() -> None:
    dumpset = synthetic_hang(2, 3)
    e = dumpset.dumps[0].entries[0]
    assert entry_bytes([e]) == 1024 * 1024 * 4
    # a crafted shape: a big number, no overflow when it becomes a bandwidth
    for dumps in dumpset.dumps.values():
        for entry in dumps.entries:
            entry.input_sizes = [[10**400, -5, True]]
    perf = analyze_perf(dumpset)
    assert entry_bytes(dumpset.dumps[0].entries[:1]) == 1 << 62
    assert perf.rows and all(r.bandwidth_gbps is None or r.bandwidth_gbps > 0 for r in perf.rows)
    assert size_bucket(0) == "< 1 KiB" and size_bucket(4 << 20) == "1-16 MiB" and size_bucket(1 << 40) == ">= 256 MiB"


def test_cli_perf_text_json_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["analyze", str(REAL / "steps"), "--perf", "--no-progress"])
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("Rank 2 costs the job most")
    main(["analyze", str(REAL / "steps"), "--perf", "--format", "json", "--no-progress",
          "--html", str(tmp_path / "r.html")])
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "frscope.perf/v1" and data["costs"][0]["rank"] == 2
    assert data == json.loads(json.dumps(perf_to_dict(analyze_perf(load_dumps([REAL / "steps"])))))
    assert '"perf":{"schema":"frscope.perf/v1"' in (tmp_path / "r.html").read_text()
    assert render_perf_text(analyze_perf(load_dumps([REAL / "steps"]))) == text


def test_cli_filters_apply_to_perf(capsys: pytest.CaptureFixture[str]) -> None:
    main(["analyze", str(REAL / "straggler"), "--perf", "--format", "json", "--no-progress", "--pg", "param_sync"])
    data = json.loads(capsys.readouterr().out)
    assert {r["group"] for r in data["rows"]} == {"1"} and data["collectives"] == 1
    main(["analyze", str(REAL / "straggler"), "--perf", "--format", "json", "--no-progress", "--op", "broadcast"])
    assert {r["op_label"] for r in json.loads(capsys.readouterr().out)["rows"]} == {"BROADCAST"}
    main(["analyze", str(REAL / "straggler"), "--perf", "--no-progress", "--rank", "0,1,3"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("None of the ranks asked about holds up the others"), first


def _entry(seq: int, group: str, created: int) -> Entry:
    return Entry(seq, group, f"g{group}", seq, 0, False, "all_reduce", "gloo:all_reduce", None, [[4]], ["Float"],
                 [[4]], ["Float"], "scheduled", True, created, None, None, None, 600_000, "1", "python", None)


def test_lateness_inherited_from_a_tensor_parallel_peer_is_charged_to_the_peer() -> None:
    """A 2 x 2 job (tp groups {0,1} {2,3}, dp groups {0,2} {1,3}): rank 1 computes 100 ms longer before each
    step's tp all_reduce; rank 0 waits for it there and so reaches the dp all_reduce 100 ms after rank 2.
    Rank 0 is last there, but the time is rank 1's (the rule the real sweep's straggler-tp jobs need:
    scripts/perf_on_sweep.py, bench/RESULTS.md). Built from the model: a rule test, the real jobs are
    in the sweep."""
    ms = 1_000_000
    t0 = 1_700_000_000_000_000_000
    entries: dict[int, list[Entry]] = {r: [] for r in range(4)}
    tp = {0: "tpA", 1: "tpA", 2: "tpB", 3: "tpB"}
    dp = {0: "dpA", 2: "dpA", 1: "dpB", 3: "dpB"}
    for step in range(1, 21):
        base = t0 + step * 300 * ms
        arrive_tp = {r: base + (100 * ms if r == 1 else 0) for r in range(4)}
        tp_done = {g: max(arrive_tp[r] for r in range(4) if tp[r] == g) for g in ("tpA", "tpB")}
        for r in range(4):
            entries[r].append(_entry(step, tp[r], arrive_tp[r]))
            entries[r].append(_entry(step, dp[r], tp_done[tp[r]] + ms + r * 1000))
    groups = {g: GroupInfo(g, f"g{g}", tuple(r for r in range(4) if g in (tp[r], dp[r])), "") for g in
              ("tpA", "tpB", "dpA", "dpB")}
    dumps = {r: RankDump(r, f"rank-{r}", "2.10", "gloo", e, captured_at_ns=t0 + 10**10) for r, e in entries.items()}
    perf = analyze_perf(DumpSet(dumps, groups, 4))
    costs = {c.rank: c.cost_ms for c in perf.costs}
    assert perf.costs[0].rank == 1 and perf.headline.startswith("Rank 1 costs the job most")
    assert costs.get(0, 0.0) < 0.05 * costs[1]  # rank 0 came last at dpA every step, but it was rank 1's time
    assert next(c for c in perf.costs if c.rank == 0).last_count == 20


def test_blame_follows_program_order_not_clocks() -> None:
    """Times that are not causal (a rank's later collectives created before its late one, as a skewed
    clock or a synthetic job makes them) do not move the blame: rank 5, 30 ms late at every 10th of 60
    collectives with creation times only, is named with all of its lateness."""
    ms = 1_000_000
    t0 = 1_700_000_000_000_000_000
    entries: dict[int, list[Entry]] = {r: [] for r in range(16)}
    for seq in range(1, 61):
        for r in range(16):
            late = 30 * ms if r == 5 and seq % 10 == 0 else 0
            entries[r].append(_entry(seq, "0", t0 + seq * 5 * ms + (r * 7919 % 13) * 100_000 + late))
    dumps = {r: RankDump(r, f"rank-{r}", "2.10", "gloo", e, captured_at_ns=t0 + 10**10) for r, e in entries.items()}
    perf = analyze_perf(DumpSet(dumps, {"0": GroupInfo("0", "default_pg", tuple(range(16)), "")}, 16))
    top = perf.costs[0]
    assert top.rank == 5 and top.last_count == 6 and top.cost_ms > 6 * 25
