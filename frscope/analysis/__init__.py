"""Cross-rank matching per process group -> findings. Pure functions over frscope.records; no I/O."""

from frscope.analysis.context import AnalysisOptions
from frscope.analysis.diagnose import analyze
from frscope.analysis.findings import (
    Bucket,
    Category,
    Finding,
    GroupProgress,
    GroupRef,
    RankProgress,
    RankView,
    Report,
)
from frscope.analysis.ops import OP_LABELS, op_label
from frscope.analysis.wording import fmt_ranks

__all__ = [
    "OP_LABELS",
    "AnalysisOptions",
    "Bucket",
    "Category",
    "Finding",
    "GroupProgress",
    "GroupRef",
    "RankProgress",
    "RankView",
    "Report",
    "analyze",
    "fmt_ranks",
    "op_label",
]
