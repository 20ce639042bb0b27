"""`frscope analyze`: formats, filters, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frscope.cli import main
from tests.unit import builders as b


@pytest.fixture
def hung(tmp_path: Path) -> Path:
    """Rank 2 never joined all_reduce #10 of the default group; a subgroup is healthy."""
    sub = ("1", "tp")
    cfg = {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
        "1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"},
    }
    for rank in range(4):
        entries = [b.entry(s, created_ns=b.T0 + s) for s in range(1, 10)]
        if rank < 2:
            entries.append(b.entry(1, op="broadcast", pg=sub, record_id=9))
        if rank != 2:
            entries.append(b.entry(10, state="started", record_id=10))
        b.write_pickle(tmp_path, rank, b.dump(entries, world=4, pg_config=cfg))
    return tmp_path


def test_text_opens_with_the_verdict(hung: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(hung)]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("Rank 2 never joined all_reduce #10 of group 0 (default_pg)")


def test_json_schema(hung: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(hung), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ranks_loaded"] == [0, 1, 2, 3] and report["missing_ranks"] == []
    [finding] = report["findings"]
    assert finding["category"] == "RankNotJoined" and finding["culprit_ranks"] == [2]
    assert finding["process_group"] == {"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3]}
    assert finding["collective_seq_id"] == 10 and finding["op"] == "all_reduce" and finding["op_label"] == "ALLREDUCE"
    assert finding["bucket"] == "cpu-side divergence"


def test_markdown(hung: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(hung), "--format", "markdown"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("# frscope report") and "## RankNotJoined" in out


def test_filters_hide_findings_but_never_the_exit_code(hung: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A filter that hides the hung rank's finding shows less; the job is still not healthy (exit code 1)."""
    for args in (["--op", "broadcast"], ["--pg", "tp"], ["--rank", "0,1"], ["--op", "ALLREDUCE", "--rank", "0-3"]):
        assert main(["analyze", str(hung), *args]) == 1, args
    capsys.readouterr()


def test_entries_side_by_side_honours_filters(hung: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["analyze", str(hung), "--entries", "--pg", "0", "--last", "2"])
    out = capsys.readouterr().out
    assert "== group 0 (default_pg)" in out and "== group 1" not in out
    line = next(line for line in out.splitlines() if "#10" in line)
    assert line.startswith("!!") and "rank 2: (not entered)" in line
    main(["analyze", str(hung), "--entries", "--op", "broadcast"])
    out = capsys.readouterr().out
    assert "broadcast" in out and "all_reduce" not in out


def test_bad_usage_and_nothing_loadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(tmp_path), "--rank", "7-3"]) == 2
    assert "bad rank range" in capsys.readouterr().err
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"\x80\x02garbage")
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no dump could be loaded" in err and "nccl_trace_rank_0" in err
    assert main(["analyze"]) == 2  # no path (nor torchfrtrace's -d DIR): one line, exit code 2
    assert "give the dump directory" in capsys.readouterr().err


def test_exits_file_is_evidence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = Path(__file__).parent.parent / "data" / "real"
    exits = tmp_path / "exits.json"
    exits.write_text(json.dumps({"2": {"exit_code": 137, "reason": "OOMKilled", "message": "Killed"}}))
    assert main(["analyze", str(real / "crash-pickle"), "--exits", str(exits), "--format", "json",
                 "--no-progress"]) == 1
    [finding] = json.loads(capsys.readouterr().out)["findings"]
    assert finding["category"] == "RankStopped" and finding["culprit_ranks"] == [2]
    assert finding["exits"]["2"]["reason"] == "OOMKilled" and "OOMKilled" in finding["summary"]
    exits.write_text("[1, 2")
    assert main(["analyze", str(real / "crash-pickle"), "--exits", str(exits), "--no-progress"]) == 2
    assert "--exits" in capsys.readouterr().err


def test_demo_succeeds_only_when_the_diagnosis_shows_the_fault(hung: Path) -> None:
    """`frscope demo` (and `make demo`) exits 0 when the findings name the fault's culprits, else 1."""
    from frscope.analysis import AnalysisOptions, analyze
    from frscope.cli import demo_missed
    from frscope.records import load_dumps

    report = analyze(load_dumps([hung]), AnalysisOptions())
    assert demo_missed("hang", {2}, report) is None
    assert demo_missed("hang", {1}, report) == (
        "the diagnosis did not show what fault 'hang' should: expected culprit rank(s) [1], got culprit rank(s) [2]")
    assert "expected no finding" in (demo_missed("none", set(), report) or "")


def test_demo_has_no_stall_after_flag_any_more(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--stall-after", "5"])
    assert exited.value.code == 2 and "--stall-after" in capsys.readouterr().err


def test_version_names_the_dump_reader(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A wheel or image built without the C scanner shows it in `frscope --version`, and so does the switch."""
    from frscope.records import scan

    expected = "C scanner" if scan.available() else "pure Python, the C scanner is not built"
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip().endswith(f"(dump reader: {expected})")
    monkeypatch.setenv(scan.ENV_OFF, "1")
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "(dump reader: pure Python" in capsys.readouterr().out
