"""A torchfrtrace command line works after `s/torchfrtrace/frscope analyze/`: each of torch's fr_trace flags
maps to frscope's own behaviour (frscope/frtrace_flags.py), filters still never change the verdict, and one
that matches nothing is exit code 2. Every command line here is first parsed by torch's own fr_trace parser
(the torch of the test environment), so they are real torchfrtrace command lines; then run through frscope's
real entry point on real gloo dumps."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from frscope.cli import main

pytestmark = pytest.mark.timeout(120)

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
# Real gloo dumps of a hang (torch 2.13): rank 1 never joined all_reduce #5 of group 1 (param_sync), so rank 0
# never joined all_reduce #4 of group 0. Files nccl_trace_rank_<r>.
HUNG = REAL / "crossgroup-pickle"


def _torchfrtrace_accepts(argv: list[str]) -> None:
    config = pytest.importorskip("torch.distributed.flight_recorder.components.config_manager")
    config.JobConfig().parse_args(argv)  # raises SystemExit on a flag torch does not know


def _frscope(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(["analyze", "--no-progress", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# (torchfrtrace's arguments, frscope's own equivalent)
SAME_AS = [
    ("{d}", "{d}"),
    ("-d {d}", "{d}"),
    ("--dir {d}", "{d}"),
    ("{d} --allow-incomplete-ranks --print_stack_trace --mismatch_cap 3 -v", "{d}"),
    ("{d} -p nccl_trace_rank_", "{d}"),
    ("{d} -j", "{d} --entries"),
    ("{d} --just_print_entries", "{d} --entries"),
    ("{d} -j --selected-ranks 0 1", "{d} --entries --rank 0,1"),
    ("{d} -j --pg-filters param_sync", "{d} --entries --pg param_sync"),
    ("{d} -j --pg-filters default_pg param_sync --selected-ranks 1",
     "{d} --entries --pg default_pg,param_sync --rank 1"),
]


@pytest.mark.parametrize(("theirs", "ours"), SAME_AS)
def test_a_torchfrtrace_command_line_does_what_frscopes_own_flags_do(
        theirs: str, ours: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(theirs.format(d=HUNG))
    if "-d" not in argv and "--dir" not in argv:
        _torchfrtrace_accepts(argv)  # torch 2.13-2.15 take the directory positionally; -d/--dir is older torch's
    got = _frscope(capsys, argv)
    want = _frscope(capsys, shlex.split(ours.format(d=HUNG)))
    assert got == want
    assert got[0] == 1  # the job is hung whatever the view or filter shows


def test_prefix_reads_only_the_files_that_have_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torchfrtrace's --prefix names the dumps among other files of the folder: the others are not read."""
    shutil.copytree(HUNG, tmp_path / "dumps")
    (tmp_path / "dumps" / "notes_rank_7").write_text("what the operator wrote down, not a dump")
    code, out, _ = _frscope(capsys, [str(tmp_path / "dumps")])
    assert "notes_rank_7" in out  # without it, the stray file is a problem of the report
    argv = [str(tmp_path / "dumps"), "-p", "nccl_trace_rank_"]
    _torchfrtrace_accepts(argv)
    code, out, _ = _frscope(capsys, argv)
    assert code == 1 and "notes_rank_7" not in out
    assert out == _frscope(capsys, [str(HUNG)])[1].replace(str(HUNG), str(tmp_path / "dumps"))


@pytest.mark.parametrize(("theirs", "says"), [
    ("{d} -j --selected-ranks 9", "--rank 9 matches no rank of this job; ranks: 0-3"),
    ("{d} -j --pg-filters nosuch", "nosuch"),
    ("{d} -p trace_of_someone_else_", "--prefix 'trace_of_someone_else_': no file in"),
    ("{d} --transform-ft --group-world-size 2", "does not read torchft replica groups"),
    ("", "give the dump directory"),
])
def test_what_cannot_be_done_is_exit_2_naming_it(theirs: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(theirs.format(d=HUNG))
    code, out, err = _frscope(capsys, argv)
    assert code == 2 and says in err and not out, (code, out, err)


def test_the_help_lists_the_torchfrtrace_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    out = capsys.readouterr().out
    for flag in ("--selected-ranks", "--pg-filters", "--just_print_entries", "--allow-incomplete-ranks",
                 "--print_stack_trace", "--prefix", "--dir", "--mismatch_cap", "--transform-ft"):
        assert flag in out, flag
