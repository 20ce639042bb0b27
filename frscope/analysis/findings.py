"""What the analysis concludes, as plain data. Every renderer (text, JSON, Markdown, the job's
condition, metrics) takes these objects, never raw dumps."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from frscope.records import Entry, Frame, LoadProblem, RankExit


class Category(StrEnum):
    """Names shared by the CLI's JSON, the operator's condition reasons and the metrics labels.
    The vocabulary follows torch's flight_recorder where it has a word for the thing."""

    MISSING_DUMPS = "MissingDumps"
    RANK_NOT_JOINED = "RankNotJoined"
    COLLECTIVE_TYPE_MISMATCH = "CollectiveTypeMismatch"
    SIZE_MISMATCH = "SizeMismatch"
    DTYPE_MISMATCH = "DtypeMismatch"
    P2P_MISMATCH = "P2PMismatch"
    NOT_COMPLETED = "NotCompleted"
    STRAGGLER = "Straggler"
    RANK_STOPPED = "RankStopped"


class Bucket(StrEnum):
    """Where to look first."""

    CPU_DIVERGENCE = "cpu-side divergence"  # ranks' Python took different paths or one is stuck in Python
    MISCONFIGURED = "misconfigured collective"  # ranks called the same collective with incompatible args
    GPU_NETWORK = "gpu/network"  # everyone called it right; the device or the fabric did not finish it
    UNKNOWN = "unknown"


BUCKET_OF: dict[Category, Bucket] = {
    Category.MISSING_DUMPS: Bucket.UNKNOWN,
    Category.RANK_NOT_JOINED: Bucket.CPU_DIVERGENCE,
    Category.COLLECTIVE_TYPE_MISMATCH: Bucket.CPU_DIVERGENCE,
    Category.SIZE_MISMATCH: Bucket.MISCONFIGURED,
    Category.DTYPE_MISMATCH: Bucket.MISCONFIGURED,
    Category.P2P_MISMATCH: Bucket.CPU_DIVERGENCE,
    Category.NOT_COMPLETED: Bucket.GPU_NETWORK,
    Category.STRAGGLER: Bucket.CPU_DIVERGENCE,
    Category.RANK_STOPPED: Bucket.UNKNOWN,
}


@dataclass(frozen=True, slots=True)
class GroupRef:
    name: str
    desc: str
    ranks: tuple[int, ...]

    def label(self) -> str:
        desc = f" ({self.desc})" if self.desc and self.desc != "undefined" else ""
        return f"group {self.name}{desc}"


@dataclass(slots=True)
class RankView:
    """One rank as it bears on a finding: what it did at the collective, and what it is doing now."""

    rank: int
    op: str | None = None
    state: str | None = None
    input_sizes: list[list[int]] | None = None
    output_sizes: list[list[int]] | None = None
    input_dtypes: list[str] | None = None
    output_dtypes: list[str] | None = None
    time_created_ns: int | None = None
    duration_ms: float | None = None
    last_enqueued_seq: int | None = None
    last_completed_seq: int | None = None
    # One line: where the rank is now ('blocked in all_reduce #7 of group 1', 'in load_batch (x.py:9)').
    activity: str | None = None
    call_site: Frame | None = None


@dataclass(frozen=True, slots=True)
class LateAt:
    """One collective a straggler reached late: how long after the median rank, and how long the
    others (the next-latest rank) waited for it there."""

    collective_seq_id: int
    op: str
    late_by_ms: float
    waited_ms: float


class Sizes(TypedDict):
    """What a rank passed to a collective, as a Finding carries it (`Finding(**sizes_of(entry))`)."""

    input_sizes: list[list[int]] | None
    output_sizes: list[list[int]] | None
    input_dtypes: list[str] | None
    output_dtypes: list[str] | None


def sizes_of(sample: Entry | None) -> Sizes:
    """The sizes and dtypes of `sample` (one rank's entry at the finding's collective); all None without one."""
    if sample is None:
        return Sizes(input_sizes=None, output_sizes=None, input_dtypes=None, output_dtypes=None)
    return Sizes(input_sizes=sample.input_sizes, output_sizes=sample.output_sizes,
                 input_dtypes=sample.input_dtypes, output_dtypes=sample.output_dtypes)


@dataclass(slots=True)
class Finding:
    category: Category
    culprit_ranks: tuple[int, ...]
    process_group: GroupRef
    summary: str  # the verdict in one sentence
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    op: str | None = None
    input_sizes: list[list[int]] | None = None
    output_sizes: list[list[int]] | None = None
    input_dtypes: list[str] | None = None
    output_dtypes: list[str] | None = None
    evidence: list[str] = field(default_factory=list)
    ranks: dict[int, RankView] = field(default_factory=dict)
    # The culprit's Python stack when the op was enqueued (from the recorder's frames), most recent first.
    culprit_frames: dict[int, tuple[Frame, ...]] = field(default_factory=dict)
    # The culprit's live stack (worker server dump_traceback), main thread only, most recent first.
    culprit_stacks: dict[int, tuple[Frame, ...]] = field(default_factory=dict)
    since_ns: int | None = None  # when the first rank entered the collective
    stalled_for_s: float | None = None
    late_by_ms: float | None = None
    ambiguous: bool = False  # no majority: the culprit ranks are candidates, not a verdict
    # For an ambiguous finding: the evidence that would single out the culprit, which this capture lacks.
    would_decide: str | None = None
    # Where `stalled_for_s` (and other ages) came from: capture time, file mtime (bounded), entries.
    age_source: str | None = None
    # Straggler at step boundaries: the collectives where it was late (at most a few), and how often.
    late_at: list[LateAt] = field(default_factory=list)
    late_count: int | None = None
    # RankStopped: when the culprit's recorder last saw anything (its newest entry), and how much older
    # that is than the other ranks' newest entry.
    last_seen_ns: int | None = None
    stale_by_s: float | None = None
    # How the ranks named here ended, where the runner knew (exit code, OOMKilled, restarts, message).
    exits: dict[int, RankExit] = field(default_factory=dict)
    consequences: list[Finding] = field(default_factory=list)

    @property
    def bucket(self) -> Bucket:
        return BUCKET_OF[self.category]


@dataclass(frozen=True, slots=True)
class RankProgress:
    last_enqueued_seq: int | None
    last_completed_seq: int | None
    inflight_op: str | None
    inflight_seq: int | None


@dataclass(frozen=True, slots=True)
class GroupProgress:
    group: GroupRef
    membership_source: str
    ranks: dict[int, RankProgress]


@dataclass(slots=True)
class Report:
    findings: list[Finding]  # root causes, most important first; consequences nest inside
    ranks_loaded: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    world_size: int
    groups: list[GroupProgress]
    problems: list[LoadProblem]
    backend: str | None
    versions: tuple[str, ...]

    @property
    def healthy(self) -> bool:
        return not self.findings
