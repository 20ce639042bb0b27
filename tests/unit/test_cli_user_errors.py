"""`frscope analyze` never says healthy by accident (issue 35): filters show less but never change the verdict,
`healthy` or the exit code; a filter value that matches nothing, an output path that cannot be written or an
unreadable input is exit code 2 with one line naming it (never 3, "internal error"); every view honours
`--format`; one bad file named on the command line is one problem, as inside a folder. Run through the real
entry point: `main` in-process, and the installed console script (`python -m frscope`) as a subprocess."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from frscope.cli import demo_install_hint, main

pytestmark = pytest.mark.timeout(60)

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
# Real gloo dumps of a hang (torch 2.13): rank 1 never joined all_reduce #5 of group 1 (param_sync, ranks 0-1),
# and so rank 0 never joined all_reduce #4 of group 0 (a consequence). Ranks 2 and 3 are culprits of nothing.
HUNG = REAL / "crossgroup-pickle"
HEALTHY = REAL / "none-pickle"
VIEWS = {"report": [], "entries": ["--entries"], "perf": ["--perf"]}


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["analyze", "--no-progress", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--op", "foo", "ops recorded: all_reduce, broadcast"),
    ("--op", "all_reduce,nope", "--op nope matches no collective"),
    ("--pg", "nosuch", "groups (name (description)): 0 (default_pg), 1 (param_sync)"),
    ("--rank", "9", "ranks: 0-3 (world size 4)"),
    ("--rank", "4-7,100", "--rank 4-7, 100 matches no rank"),
])
def test_a_filter_that_matches_nothing_is_exit_2_naming_it(
    view: str, flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for fmt in ("text", "json", "markdown"):
        code, out, err = _run(capsys, str(HUNG), flag, value, "--format", fmt, *VIEWS[view])
        assert code == 2 and out == "", (fmt, out)
        assert err.count("\n") == 1 and err.startswith("frscope analyze: ") and says in err, err


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("filters", [["--op", "broadcast"], ["--rank", "2-3"], ["--rank", "3", "--pg", "default_pg"],
                                     ["--op", "BROADCAST", "--pg", "1", "--rank", "0-1"]])
def test_a_filter_that_hides_the_hang_keeps_it_unhealthy(
    view: str, filters: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, str(HUNG), *filters, "--format", "json", *VIEWS[view])
    assert code == 1, out[:300]  # the job's findings decide the exit code, whatever the view shows
    if view == "report":
        report = json.loads(out)
        assert report["healthy"] is False and report["findings"] == [] and report["findings_total"] == 1
        assert report["verdict"].startswith("Rank 1 never joined all_reduce #5 of group 1 (param_sync)")
        assert report["filters"]["op" if "--op" in filters else "rank" if "--rank" in filters else "pg"]
    text = _run(capsys, str(HUNG), *filters)[1]
    assert text.startswith("Rank 1 never joined") and "none of the job's 1 finding(s) matches" in text
    markdown = _run(capsys, str(HUNG), *filters, "--format", "markdown")[1]
    assert "**Rank 1 never joined" in markdown and "none of the job's 1 finding(s) matches" in markdown


def test_a_filter_on_the_culprit_shows_it_and_a_healthy_job_stays_healthy(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, str(HUNG), "--op", "ALLREDUCE", "--rank", "1", "--format", "json")
    report = json.loads(out)
    assert code == 1 and [f["culprit_ranks"] for f in report["findings"]] == [[1]]  # with its consequence
    assert report["filters"] == {"op": ["allreduce"], "pg": None, "rank": [1]} and report["findings_total"] == 1
    code, out, _ = _run(capsys, str(HEALTHY), "--rank", "0", "--format", "json")
    assert code == 0 and json.loads(out)["healthy"] is True
    code, out, _ = _run(capsys, str(HEALTHY), "--format", "json")
    assert code == 0 and "filters" not in json.loads(out)  # unfiltered: the documents the operator stores


@pytest.mark.parametrize("view", VIEWS)
def test_every_view_honours_format(view: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, str(HUNG), "--format", "json", *VIEWS[view])
    doc = json.loads(out)
    assert code == 1 and doc["schema"] == {"report": "frscope.report/v1", "entries": "frscope.entries/v1",
                                           "perf": "frscope.perf/v1"}[view]
    code, out, _ = _run(capsys, str(HUNG), "--format", "markdown", *VIEWS[view])
    assert code == 1 and out.startswith("# frscope") and "\n|---" in out or "\n## " in out
    code, out, _ = _run(capsys, str(HUNG), *VIEWS[view])
    assert code == 1 and not out.startswith(("{", "#"))


def test_entries_json_and_markdown_show_the_rank_that_did_not_enter(capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(_run(capsys, str(HUNG), "--entries", "--format", "json", "--pg", "param_sync")[1])
    [group] = doc["groups"]
    assert group["name"] == "1" and group["ranks"] == [0, 1]
    stuck = next(c for c in group["collectives"] if c["collective_seq_id"] == 5)
    assert not stuck["agree"]
    assert {"ranks": [1], "entries": None, "absent": "not entered"} in stuck["cells"]
    assert {"ranks": [0], "entries": [{"op": "all_reduce", "input_sizes": [[8, 4]], "input_dtypes": ["Float"],
                                       "state": "scheduled"}], "absent": None} in stuck["cells"]
    markdown = _run(capsys, str(HUNG), "--entries", "--format", "markdown", "--pg", "param_sync")[1]
    assert "| #5 | **differ** |" in markdown and "rank 1: `(not entered)`" in markdown


@pytest.mark.parametrize("flag", ["-o", "--html", "--trace"])
def test_an_output_path_that_cannot_be_written_is_exit_2(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing" / "dir"
    for path, says in ((missing / "r.txt", f"no such directory {str(missing)!r}"), (tmp_path, "it is a directory")):
        code, out, err = _run(capsys, str(HUNG), flag, str(path))
        assert code == 2 and out == "" and err == f"frscope analyze: cannot write {flag} {path}: {says}\n", err
    written = tmp_path / "r.out"
    assert _run(capsys, str(HUNG), flag, str(written))[0] == 1 and written.stat().st_size > 0


def test_unreadable_inputs_are_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, str(tmp_path / "nope"))
    assert code == 2 and err == f"frscope analyze: no dump could be loaded: {tmp_path / 'nope'}: no such file or " \
        "directory\n"
    code, _, err = _run(capsys, str(HUNG), "--exits", str(tmp_path / "exits.json"))
    assert code == 2 and err.count("\n") == 1 and "--exits" in err and "No such file" in err
    (tmp_path / "exits.json").write_text("{not json")
    code, _, err = _run(capsys, str(HUNG), "--exits", str(tmp_path / "exits.json"))
    assert code == 2 and err.count("\n") == 1 and "--exits" in err
    for bad in (["--entries", "--last", "0"], ["--jobs", "-1"], ["--max-bytes", "lots"]):
        with pytest.raises(SystemExit) as stopped:  # argparse: usage and one line, exit code 2
            _run(capsys, str(HUNG), *bad)
        assert stopped.value.code == 2 and bad[-2] in capsys.readouterr().err


def test_one_bad_file_named_on_the_command_line_is_one_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A truncated .gz, a file over --max-bytes and garbage, named beside good dumps: each is a problem of the
    report, the others are analysed, and the exit code is the one the same files give inside a folder."""
    named = tmp_path / "named"
    named.mkdir()
    good = [shutil.copy(p, named / p.name) for p in sorted(HUNG.iterdir())]
    whole = gzip.compress((HUNG / "nccl_trace_rank_0").read_bytes())
    (named / "nccl_trace_rank_4.gz").write_bytes(whole[: len(whole) // 2])
    (named / "nccl_trace_rank_5").write_bytes(b"\x80\x04garbage, not a pickle")
    (named / "nccl_trace_rank_6").write_bytes(b"x" * 300_000)
    bad = ["nccl_trace_rank_4.gz", "nccl_trace_rank_5", "nccl_trace_rank_6"]
    cap = ["--max-bytes", "200000"]
    code, out, err = _run(capsys, *map(str, good), *(str(named / b) for b in bad), *cap, "--format", "json")
    report = json.loads(out)
    assert report["ranks_loaded"] == [0, 1, 2, 3] and report["findings"][0]["culprit_ranks"] == [1]
    assert sorted(Path(p["source"]).name for p in report["problems"] if p["kind"] == "error") == bad
    in_folder, folder_out, _ = _run(capsys, str(named), *cap, "--format", "json")
    assert code == in_folder == 1
    assert json.loads(folder_out)["problems"] == report["problems"]
    # A bundle cut short, named beside the dumps: one problem too (it ended the run with exit 2 before).
    (named / "bundle.json.gz").write_bytes(gzip.compress(b'{"schema": "frscope.bundle/v1", "windows": []}')[:20])
    code, out, _ = _run(capsys, *map(str, good), str(named / "bundle.json.gz"), "--format", "json")
    assert code == 1 and [Path(p["source"]).name for p in json.loads(out)["problems"]] == ["bundle.json.gz"]


def _frscope(*args: str, block: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """The console script's code path (`python -m frscope`) in a fresh interpreter; `block`: top-level packages
    this interpreter behaves as if they were not installed (an import hook: the way a machine without them
    fails, without uninstalling anything from the test environment)."""
    hook = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {block!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import importlib.util\n"
        "_find = importlib.util.find_spec\n"
        f"importlib.util.find_spec = lambda n, *a: None if n.split('.')[0] in {block!r} else _find(n, *a)\n"
        "from frscope.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run([sys.executable, "-c", hook, *args], capture_output=True, text=True, timeout=50,
                          check=False)


def test_console_entry_point_exit_codes(tmp_path: Path) -> None:
    assert _frscope("analyze", str(HUNG), "--no-progress").returncode == 1
    assert _frscope("analyze", str(HEALTHY), "--no-progress").returncode == 0
    done = _frscope("analyze", str(HUNG), "--op", "foo")
    assert done.returncode == 2 and "--op foo matches no collective" in done.stderr
    done = _frscope("analyze", str(HUNG), "-o", str(tmp_path / "missing" / "r.txt"))
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1


def test_demo_without_torch_says_how_to_get_it() -> None:
    done = _frscope("demo", block=("torch",))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{sys.executable} -m pip install 'frscope[demo]'" in done.stderr and "torch" in done.stderr


@pytest.mark.parametrize("command", ["operator", "sidecar", "doctor"])
def test_cluster_commands_without_the_extra_say_which_to_install(command: str) -> None:
    done = _frscope(command, "--help", block=("aiohttp", "kopf", "prometheus_client", "cryptography", "jwt"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"frscope {command}: ") and "pip install 'frscope[cluster]'" in done.stderr
    # The analyzer alone needs none of them.
    done = _frscope("analyze", str(HUNG), "--no-progress", block=("aiohttp", "kopf", "prometheus_client",
                                                                  "cryptography", "jwt", "yaml", "torch"))
    assert done.returncode == 1 and done.stdout.startswith("Rank 1 never joined"), done.stderr


def _as_nobody() -> list[str]:
    """Run as an unprivileged user (root reads every file whatever its mode): `setpriv` as root, else as is."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a mode-000 folder is readable")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder the unprivileged user can enter (pytest's tmp_path lies in a folder closed to others)."""
    with tempfile.TemporaryDirectory(prefix="frscope-cli-") as name:
        path = Path(name)
        path.chmod(0o755)
        yield path


def test_folders_this_user_cannot_read_are_named(open_dir: Path) -> None:
    """A closed folder named alone is exit 2 naming it; beside readable dumps it is a problem of the report; an
    output path inside it is exit 2 too (not 3). The real console script, as an unprivileged user."""
    tmp_path = open_dir
    dumps = tmp_path / "dumps"
    shutil.copytree(REAL / "hang", dumps)
    dumps.chmod(0o755)
    for f in dumps.iterdir():
        f.chmod(0o644)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o000)
    # The interpreter and frscope must be readable by that user too: run the checkout's code through -m.
    python = [sys.executable, "-m", "frscope"]
    runner = _as_nobody()
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"}
    probe = subprocess.run([*runner, *python, "--version"], capture_output=True, text=True, env=env, check=False)
    if probe.returncode != 0:
        pytest.skip(f"the unprivileged user cannot run this checkout's Python: {probe.stderr[-300:]}")
    try:
        alone = subprocess.run([*runner, *python, "analyze", str(locked)], capture_output=True, text=True, env=env,
                               check=False, timeout=50)
        assert alone.returncode == 2 and alone.stderr == \
            f"frscope analyze: no dump could be loaded: {locked}: cannot read: Permission denied\n", alone.stderr
        beside = subprocess.run([*runner, *python, "analyze", "--format", "json", "--no-progress", str(locked),
                                 str(dumps)], capture_output=True, text=True, env=env, check=False, timeout=50)
        report = json.loads(beside.stdout)
        assert beside.returncode == 1 and report["ranks_loaded"] == [0, 1, 2, 3]
        assert {"source": str(locked), "rank": None, "kind": "error",
                "message": "cannot read: Permission denied"} in report["problems"]
        out = subprocess.run([*runner, *python, "analyze", str(dumps), "-o", str(locked / "r.txt")],
                             capture_output=True, text=True, env=env, check=False, timeout=50)
        assert out.returncode == 2 and out.stderr == \
            f"frscope analyze: cannot write -o {locked / 'r.txt'}: Permission denied\n", out.stderr
    finally:
        locked.chmod(0o700)


def test_demo_keep_path_that_cannot_be_made_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(With torch installed: the check for it comes first.)"""
    if demo_install_hint() is not None:
        pytest.skip("torch is not installed: frscope demo says so first (test_demo_without_torch_says_how_to_get_it)")
    (tmp_path / "file").write_text("")
    assert main(["demo", "--keep", str(tmp_path / "file" / "kept")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("frscope demo: cannot use --keep") and err.count("\n") == 1, err
