"""`make test`'s lanes (scripts/test_lanes.py): every folder of tests runs in one, and the progress line
reads a lane's log wherever its tail window opens."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _lanes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("test_lanes_script", ROOT / "scripts" / "test_lanes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_folder_of_tests_is_in_exactly_one_lane() -> None:
    lanes = _lanes().LANES
    laned = [path for paths in lanes.values() for path in paths]
    folders = sorted(f"tests/{d.name}" for d in (ROOT / "tests").iterdir() if d.is_dir() and any(d.glob("test_*.py")))
    assert sorted(laned) == folders


def test_progress_is_the_newest_mark_even_when_the_window_opens_inside_a_line(tmp_path: Path) -> None:
    lanes = _lanes()
    log = tmp_path / "lane.log"
    # the last 4096 bytes begin with the end of a progress line, its bracket cut off
    log.write_text("x" * 5000 + " 2%]\n" + "tests/e2e/test_a.py ..   [ 17%]\n" + "tests/e2e/test_b.py .")
    assert lanes._last_progress(log) == "[ 17%]"
    log.write_text("y" * 5000 + "  3%]\n")
    assert lanes._last_progress(log).endswith("bytes of output")
    assert lanes._last_progress(tmp_path / "missing.log") == "no output yet"
