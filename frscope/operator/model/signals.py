"""What makes the operator look: the signals, and how each is read off an object or a sidecar.

- a sidecar reports a stall (`/v1/status` polled at a bounded rate, or a push);
- a trainer container ended with the collective watchdog's message in its termination message;
- a trainer container ended otherwise in failure (exit code != 0, OOMKilled): a crashed rank;
- the job's latest condition turned Failed or Restarting.

A signal names the job and the trainer run it is about; a stall also names the group and sequence
id, which lets the operator skip a gather for an incident it has already diagnosed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from frscope.operator.model.jobkinds import PYTORCHJOB, JobKind
from frscope.operator.model.objects import JobKey, PodInfo


class SignalKind(StrEnum):
    SIDECAR_STALL = "SidecarStall"
    SIDECAR_PUSH = "SidecarPush"
    WATCHDOG_TIMEOUT = "WatchdogTimeout"
    TRAINER_EXIT = "TrainerExit"
    JOB_FAILED = "JobFailed"
    JOB_RESTARTING = "JobRestarting"


@dataclass(frozen=True, slots=True)
class Signal:
    kind: SignalKind
    job: JobKey
    detail: str  # one line for logs
    pod: str | None = None
    run: int | None = None  # the trainer run the signal is about (None: the latest one)
    group: str | None = None
    seq: int | None = None
    restarts: int | None = None  # torchrun's restart count of the stalled ranks (None: not known)


# The watchdog's words, NCCL and gloo, as they reach a termination message (FallbackToLogsOnError).
_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout"
    r"|Some NCCL operations have failed or timed out"
    r"|Heartbeat monitor timed out"
    r"|ProcessGroupNCCL.{0,80}timed out"
    r"|Timed out waiting \d+ms for (?:send|recv) operation"
    r"|Operation timed out after \d+ ?ms"
    r"|\bcollective operation timeout\b",
    re.IGNORECASE | re.DOTALL,
)
_SEQ = re.compile(r"SeqNum=(\d+)")
_PG = re.compile(r"PG ID (\S+?)(?: PG GUID (\S+?)(?:\(([^)]*)\))?)?[ \]]")


def watchdog_match(message: str) -> tuple[bool, str | None, int | None]:
    """(is a watchdog timeout, group name if said, collective sequence id if said)."""
    if not message or not _WATCHDOG.search(message):
        return False, None, None
    seq = _SEQ.search(message)
    pg = _PG.search(message)
    group = None
    if pg:
        group = pg.group(2) or pg.group(1)
    return True, group, int(seq.group(1)) if seq else None


def watchdog_signals(pod: PodInfo) -> list[Signal]:
    out: list[Signal] = []
    for term in pod.terminations:
        matched, group, seq = watchdog_match(term.message)
        if matched:
            line = " ".join(term.message.split())[-200:]
            out.append(
                Signal(SignalKind.WATCHDOG_TIMEOUT, JobKey(pod.namespace, pod.job_name),
                       f"pod {pod.name} container {term.container} (run {term.run}) ended: {line}",
                       pod=pod.name, run=term.run, group=group, seq=seq)
            )
    return out


def exit_signals(pod: PodInfo) -> list[Signal]:
    """A trainer run that ended in failure without the watchdog's words (those are `watchdog_signals`):
    a rank crashed or was killed. Its exit is evidence the gather before it did not have (the sidecar's
    exit push can arrive before the kubelet reports the container's end)."""
    out: list[Signal] = []
    for term in pod.terminations:
        failed = term.reason == "OOMKilled" or (term.exit_code is not None and term.exit_code != 0)
        if failed and not watchdog_match(term.message)[0]:
            out.append(Signal(SignalKind.TRAINER_EXIT, JobKey(pod.namespace, pod.job_name),
                              f"pod {pod.name} container {term.container} (run {term.run}) exited with code "
                              f"{term.exit_code}{f' ({term.reason})' if term.reason else ''}",
                              pod=pod.name, run=term.run))
    return out


def job_condition_signal(key: JobKey, conditions: list[dict[str, object]],
                         job_kind: JobKind = PYTORCHJOB) -> Signal | None:
    """Failed or Restarting as the job's state (its latest True condition of its own controller)."""
    for cond in reversed(conditions):
        kind = cond.get("type")
        if cond.get("status") != "True" or kind not in job_kind.state_types:
            continue
        if kind in job_kind.failed_types:
            return Signal(SignalKind.JOB_FAILED, key, f"job {key} Failed: {cond.get('reason', '')}")
        if kind in job_kind.restarting_types:
            return Signal(SignalKind.JOB_RESTARTING, key, f"job {key} Restarting: {cond.get('reason', '')}")
        return None
    return None
