"""Renderers: findings -> text, JSON, Markdown, one-line messages, side-by-side entries."""

from frscope.report.markdown import render_markdown
from frscope.report.oneline import one_line
from frscope.report.serialize import SCHEMA, finding_to_dict, report_to_dict
from frscope.report.text import render_text
from frscope.report.verdict import verdict

__all__ = ["SCHEMA", "finding_to_dict", "one_line", "render_markdown", "render_text", "report_to_dict", "verdict"]
