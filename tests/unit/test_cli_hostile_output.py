"""Output a terminal can trust (issue 34): an incident bundle written by a hostile tenant puts terminal escapes
in its exits (reason, termination message) and its stacks (file and function names). `frscope analyze` prints
them in text and Markdown as visible escapes: no ESC, no C0/C1 control character, no bidi override, no line of
its own making; Markdown keeps them from changing the document (code fences, table cells)."""

from __future__ import annotations

import gzip
import json
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from frscope import wire
from frscope.cli import main
from frscope.records import RankExit
from frscope.records.bundle import make_bundle
from frscope.report.printable import md_code, md_text, printable

pytestmark = pytest.mark.timeout(60)

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
OSC_TITLE = "\x1b]0;pwned\x07"
CSI_CLEAR = "\x1b[2J"
OSC_CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNofHNo\x07"
C1_CSI = "\x9b2J"
BIDI = "\u202eyp.\u2066"
# One line of a hostile name (a stack line cannot hold a newline: the dump_traceback text is read by lines).
NAME = f"{OSC_TITLE}{CSI_CLEAR}{OSC_CLIPBOARD}{C1_CSI}{BIDI}[9] fake | ``` <b>"
# An exit's reason can hold newlines too (a termination message is joined to one line when it is read).
REASON = "OOMKilled\r" + NAME + "\n[1] RankNotJoined (forged)\u2028"


def _bundle(path: Path, *, exits: bool, group_desc: str | None = None) -> Path:
    """The real hang fixture (rank 1 stuck in load_batch) with hostile names in every rank's stack, with
    `exits` hostile reasons and messages for every rank, and `group_desc` as every group's description."""
    pieces = [json.loads(p.read_text()) for p in sorted((REAL / "hang").glob("rank-*.json"))]
    for piece in pieces:
        if group_desc is not None:
            for cfg in piece["trace"]["pg_config"].values():
                cfg["desc"] = group_desc
            for entry in piece["trace"]["entries"]:
                entry["process_group"] = [entry["process_group"][0], group_desc]
        piece["stacks"] = (piece["stacks"].replace("/work/main/frscope/demo/job.py", f"/app/{NAME}.py")
                           .replace("load_batch", f"load_{NAME}"))
    head = wire.snapshot_head(pod="worker-0", namespace="tenant", node="node-a",
                              captured_at_ns=max(p["captured_at_ns"] for p in pieces), reason="stall")
    ranks = {r: RankExit(r, exit_code=137 if r == 1 else 1, reason=REASON, message=NAME)
             for r in range(4)} if exits else {}
    bundle = make_bundle(job={"namespace": "tenant", "name": "job"}, incident={"id": "i-1"},
                         windows=[{**head, "ranks": pieces, "errors": []}], exits=ranks, report=None, timeline=None)
    path.write_bytes(gzip.compress(json.dumps(bundle).encode()))
    return path


def _acting(text: str) -> list[str]:
    """Every character a terminal would act on: control (Cc) but the newlines the renderer writes, format
    (Cf: bidi overrides, isolates), line and paragraph separators."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]


def _shown(markdown: str) -> str:
    """What a Markdown reader sees of the renderer's backslash escapes."""
    return re.sub(r"\\([\\`*_\[\]<>|~&])", r"\1", markdown)


def _analyze(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["analyze", "--no-progress", *args]) == 1
    return capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["text", "markdown"])
@pytest.mark.parametrize("exits", [True, False], ids=["exits", "stacks"])
def test_hostile_bundle_prints_no_escape(fmt: str, exits: bool, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = _analyze(capsys, str(_bundle(tmp_path / "b.json.gz", exits=exits)), "--format", fmt)
    assert _acting(out) == []
    out = _shown(out) if fmt == "markdown" else out
    # The hostile text reached the output (the test can fail), shown as escapes a reader sees.
    assert out.count("\\x1b]0;pwned\\x07") >= 2 and "\\x1b]52;c;" in out and "\\x9b2J" in out and "\\u202e" in out
    if exits:
        assert "\\x0a[1] RankNotJoined (forged)\\u2028" in out
        assert not any(line.lstrip().startswith("[1] RankNotJoined (forged)") for line in out.splitlines())
    else:
        assert re.search(r"load_.*pwned.* \(/app/.*\.py:114\)", out)  # the culprit's frame, named as it is


def test_markdown_keeps_hostile_names_inside_their_cells_and_fences(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = _analyze(capsys, str(_bundle(tmp_path / "b.json.gz", exits=True)), "--format", "markdown")
    for line in out.splitlines():
        if line.startswith("| rank "):  # a row of the exits table: two cells, whatever the message holds
            assert len(re.findall(r"(?<!\\)\|", line)) == 3, line
    prose = re.sub(r"\n(`{3,})\n.*?\n\1\n", "\n", out, flags=re.S)  # in a code block '<b>' is text already
    assert "<b>" not in prose and "\\<b\\>" in prose
    stack = _analyze(capsys, str(_bundle(tmp_path / "s.json.gz", exits=False)), "--format", "markdown")
    fence = next(line for line in stack.splitlines() if line.startswith("```"))
    assert fence == "````"  # longer than the ``` a frame holds: no frame closes the block
    assert stack.count("\n````\n") == 2 and re.search(r"\n````\n[^`]*load_.*\.py:114\)\n", stack)


def test_entries_and_problems_print_no_escape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A crafted file name (a problem's source) and an op name from the dump in the other views."""
    bad = tmp_path / f"nccl_trace_rank_7{OSC_TITLE}"
    bad.write_bytes(b"\x80\x04 not a pickle")
    for fmt in ("text", "markdown"):
        out = _analyze(capsys, str(REAL / "hang"), str(bad), "--format", fmt)
        assert _acting(out) == [] and "\\x1b]0;pwned\\x07" in (_shown(out) if fmt == "markdown" else out)
        assert _acting(_analyze(capsys, str(REAL / "hang"), "--entries", "--format", fmt)) == []


@pytest.mark.parametrize("view", [[], ["--entries"], ["--perf"]], ids=["report", "entries", "perf"])
@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_a_hostile_group_description_prints_no_escape_in_any_view(view: list[str], fmt: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _bundle(tmp_path / "g.json.gz", exits=False, group_desc=f"tp{NAME}")
    out = _analyze(capsys, str(bundle), "--format", fmt, *view)
    assert _acting(out) == []
    assert "tp\\x1b]0;pwned\\x07" in (_shown(out) if fmt == "markdown" else out), out[:2000]


@pytest.mark.parametrize("char", [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]
                         + ["\u200e", "\u200f", "\u061c", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e",
                            "\u2066", "\u2067", "\u2068", "\u2069", "\u2028", "\u2029", "\ufeff", "\U000e0001"])
def test_printable_escapes_every_control_and_bidi_character(char: str) -> None:
    shown = printable(f"a{char}b")
    assert _acting(shown) == [] and "\n" not in shown and shown.startswith("a\\") and shown.endswith("b")
    assert _acting(md_text(f"a{char}b")) == [] and _acting(md_code(f"a{char}b")) == []


def test_printable_keeps_what_is_harmless() -> None:
    assert printable("load_batch (/app/train.py:57) ✓ données 数据") == "load_batch (/app/train.py:57) ✓ données 数据"
    assert printable("a\u00a0b") == "a b"  # a no-break space is a space
    cases: list[tuple[str, Any]] = [("`x`", "`` `x` ``"), ("a|b", "`a\\x7cb`")]
    for text, code in cases:
        assert md_code(text) == code
    assert md_text("*a* _b_ [c](d) <e> |") == "\\*a\\* \\_b\\_ \\[c\\](d) \\<e\\> \\|"


def test_the_one_line_kubernetes_message_prints_no_escape(tmp_path: Path) -> None:
    """The condition message and Event the operator writes from the same finding (`kubectl describe` prints it)."""
    from frscope.analysis import analyze
    from frscope.records import load_dumps
    from frscope.report import one_line

    dumpset = load_dumps([_bundle(tmp_path / "s.json.gz", exits=False)], jobs=1)
    [finding] = analyze(dumpset).findings
    assert "\x1b" in finding.summary  # the analysis keeps the name as it is; the renderers show it
    line = one_line(finding)
    assert _acting(line) == [] and "load_\\x1b]0;pwned\\x07" in line and len(line.encode()) <= 1024
