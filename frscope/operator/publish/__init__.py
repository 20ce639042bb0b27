"""Publishing a diagnosis: pure builders (condition, Events, report object) and the Publisher that
writes them through the API server."""

from frscope.operator.publish.condition import make_condition, needs_write, place_condition
from frscope.operator.publish.events import build_event, clip_line
from frscope.operator.publish.publisher import (
    JobGone,
    Publication,
    Published,
    Publisher,
)
from frscope.operator.publish.report_cr import build_report_cr, progress_lines, report_name

__all__ = [
    "JobGone",
    "Publication",
    "Published",
    "Publisher",
    "build_event",
    "build_report_cr",
    "clip_line",
    "make_condition",
    "needs_write",
    "place_condition",
    "progress_lines",
    "report_name",
]
