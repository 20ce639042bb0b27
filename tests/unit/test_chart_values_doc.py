"""charts/frscope/README.md's values reference is what scripts/chart_values_doc.py makes of values.yaml
now (a value added or re-documented without regenerating fails here), and the comment reader keeps
each `# --` description with its own key."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import yaml

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chart_values_doc.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_values_doc", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("chart_values_doc", module)
    spec.loader.exec_module(module)
    return module


def test_the_chart_readme_is_current() -> None:
    assert _script().main(["--check"]) == 0, "run: python scripts/chart_values_doc.py"


def test_every_top_level_value_is_in_the_reference() -> None:
    chart = SCRIPT.parents[1] / "charts" / "frscope"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    readme = (chart / "README.md").read_text()
    for key in values:
        assert f"| `{key}" in readme, key


SAMPLE = """\
# A plain comment is not a description.
plain: 1
# -- First line
# and its continuation.
outer:
  # -- Inner's own.
  inner: "x"
  other: [1, 2]

  # -- After a blank line.
  late: {}
"""


def test_descriptions_stay_with_their_keys() -> None:
    doc = _script()
    docs = doc.documented_keys(SAMPLE)
    assert docs == {"outer": "First line and its continuation.", "outer.inner": "Inner's own.",
                    "outer.late": "After a blank line."}
    rows = doc.rows(yaml.safe_load(SAMPLE), docs)
    assert [r[0] for r in rows] == ["plain", "outer", "outer.inner", "outer.other", "outer.late"]
    assert rows[3][1] == "`[1, 2]`" and rows[0][2] == ""


def test_a_pipe_in_a_description_does_not_split_the_row() -> None:
    table = _script().table("# -- a | b\nkey: 1\n")
    assert table.splitlines()[-1] == "| `key` | `1` | a \\| b |"
