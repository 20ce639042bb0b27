"""The operator's web UI: a list of watched jobs with their verdicts, and a live collective timeline per
job. aiohttp routes that the operator mounts (`create_app(provider)` as a sub-application) over a data
provider it implements (`JobProvider`). Imports report/analysis/records only (import-linter layers).
See docs/timeline.md."""

from frscope.webui.memory import MemoryProvider
from frscope.webui.nodes import NodeIncidentRow, NodeProvider, NodeSummary
from frscope.webui.provider import JobDetail, JobProvider, JobSummary, RankStatus, detail_revision
from frscope.webui.routes import create_app

__all__ = [
    "JobDetail",
    "JobProvider",
    "JobSummary",
    "MemoryProvider",
    "NodeIncidentRow",
    "NodeProvider",
    "NodeSummary",
    "RankStatus",
    "create_app",
    "detail_revision",
]
