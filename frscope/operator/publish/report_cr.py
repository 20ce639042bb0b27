"""The `FlightRecorderReport` object: frscope's full report about one incident, owned by the job.

Shaped for `kubectl describe` (which prints fields sorted by name): `diagnosis` (verdict, what, who)
comes right after the API version, then `evidence` (culprit stacks), `job`, and `progress` (per
group, ranks grouped by where they stand); `report` is the whole JSON report (docs/report-json.md),
trimmed step by step when the object would exceed `limit_bytes` (etcd takes 1.5 MiB per object).
"""

from __future__ import annotations

import json
from typing import Any

from frscope.analysis import Finding, Report, fmt_ranks
from frscope.operator import names
from frscope.operator.model.objects import JobRef, dns_name
from frscope.report import report_to_dict

DEFAULT_LIMIT_BYTES = 512 * 1024
MAX_LINES = 40
MAX_LINE = 500
MAX_STACK_FRAMES = 30
MAX_CULPRIT_STACKS = 8
MAX_GROUPS = 64
MAX_PROBLEMS = 50


def report_name(job: JobRef, incident: str) -> str:
    return dns_name(job.name, incident, limit=253)


def _clip(text: str, limit: int = MAX_LINE) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _group_label(finding: Finding) -> str:
    g = finding.process_group
    return f"{g.name} ({g.desc})" if g.desc and g.desc != "undefined" else g.name


def _stacks(finding: Finding) -> dict[str, list[str]]:
    """Rank -> its stack, one frame per list item: `kubectl describe` prints each item on its own
    line, indented, where one multi-line string would break its layout."""
    out: dict[str, list[str]] = {}
    ranks = sorted(set(finding.culprit_stacks) | set(finding.culprit_frames))[:MAX_CULPRIT_STACKS]
    for rank in ranks:
        live = finding.culprit_stacks.get(rank) or ()
        frames = live or finding.culprit_frames.get(rank) or ()
        label = "live stack" if live else "stack when the collective was enqueued"
        lines = [f"({label}, most recent call first)"]
        lines += [_clip(str(f)) for f in frames[:MAX_STACK_FRAMES]]
        if len(frames) > MAX_STACK_FRAMES:
            lines.append(f"... {len(frames) - MAX_STACK_FRAMES} more frames")
        out[str(rank)] = lines
    return out


def progress_lines(report: Report) -> dict[str, list[str]]:
    """Per group: ranks bucketed by (last completed, in flight): 1,024 ranks stay a few lines."""
    out: dict[str, list[str]] = {}
    for gp in report.groups[:MAX_GROUPS]:
        buckets: dict[tuple[int | None, str | None, int | None], list[int]] = {}
        for rank, p in gp.ranks.items():
            buckets.setdefault((p.last_completed_seq, p.inflight_op, p.inflight_seq), []).append(rank)
        lines = []
        for (done, op, seq), ranks in sorted(buckets.items(), key=lambda kv: min(kv[1])):
            what = f"completed #{done}" if done is not None else "completed nothing"
            if op is not None:
                what += f", in {op} #{seq}"
            word = "rank" if len(ranks) == 1 else "ranks"
            lines.append(_clip(f"{word} {fmt_ranks(ranks)}: {what}"))
        label = f"group {gp.group.name}" + (f" ({gp.group.desc})" if gp.group.desc else "")
        out[label] = lines[:MAX_LINES]
    return out


def _size(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":")).encode())


def _trim_report(full: dict[str, Any], keep_ranks: set[int], limit: int,
                 rest: int) -> tuple[dict[str, Any], str | None]:
    """The report dict, smaller step by step until the object fits; the note says what was cut. `full`
    is not changed: what is cut is copied level by level (a deep copy of an 8,192-rank report took
    ~1 s of the event loop)."""
    if rest + _size(full) <= limit:
        return full, None
    trimmed = dict(full)
    groups = []
    for group in full.get("groups", []):
        progress = group.get("progress") or {}
        kept = {r: v for r, v in progress.items() if int(r) in keep_ranks}
        groups.append({**group, "progress": kept, "progress_truncated": len(progress) - len(kept)})
    if "groups" in full:
        trimmed["groups"] = groups
    trimmed["problems"] = full.get("problems", [])[:MAX_PROBLEMS]
    if rest + _size(trimmed) <= limit:
        return trimmed, "per-rank progress kept for the culprit ranks only (see progress for every rank)"
    trimmed.pop("groups", None)

    def culprits_only(sub: dict[str, Any]) -> dict[str, Any]:
        return {**sub, "ranks": {r: v for r, v in sub.get("ranks", {}).items() if int(r) in keep_ranks},
                "culprit_frames": {}}

    if "findings" in full:
        trimmed["findings"] = [
            {**culprits_only(finding), **({"consequences": [culprits_only(c) for c in finding["consequences"]]}
                                          if "consequences" in finding else {})}
            for finding in full["findings"]]
    if rest + _size(trimmed) <= limit:
        return trimmed, "groups and non-culprit rank details left out (too large)"
    verdict = full.get("verdict")
    return {"schema": full.get("schema"), "verdict": verdict, "truncated": True}, (
        "the full report was too large for one object; run `frscope analyze` on the gathered snapshots"
    )


def build_report_cr(job: JobRef, report: Report, *, incident: str, attempt: str, signal: str,
                    missing_pods: dict[str, str], gathered_at: str, limit_bytes: int = DEFAULT_LIMIT_BYTES,
                    condition: tuple[str, str] | None = None, impact: dict[str, Any] | None = None,
                    revision: int = 0, state: dict[str, str] | None = None) -> dict[str, Any]:
    """The report object. It is also frscope's bookkeeping (the operator writes nothing on the job but
    its condition): `job.incident/attempt/processGroupName` + `diagnosis.what.collectiveSeqId` say
    which incident it diagnosed, `job.condition` (reason, message) what the job's condition says.
    `impact` (actions.Impact.to_json: watchdog timeout, GPUs, culprit pods and nodes) is what acting on
    the report reads later (docs/actions.md); the `action` field is written by the actor, not here.
    `revision`: how many times the report was rewritten with trainer ends that came after it (0: never).
    `state`: `report_state(...)`; an incident's report is Confirmed when it is written."""
    finding = report.findings[0] if report.findings else None
    name = report_name(job, incident)
    culprits = sorted(finding.culprit_ranks) if finding else []
    diagnosis: dict[str, Any] = {
        "verdict": _clip(finding.summary if finding else "No problem found.", 1024),
        "what": {
            "category": finding.category.value if finding else "Healthy",
            "bucket": finding.bucket.value if finding else "",
            "op": finding.op or "" if finding else "",
            "collectiveSeqId": finding.collective_seq_id if finding else None,
            "processGroup": _group_label(finding) if finding else "",
            "stalledForSeconds": round(finding.stalled_for_s, 1) if finding and finding.stalled_for_s else None,
            "ambiguous": finding.ambiguous if finding else False,
        },
        "who": {
            "culprits": fmt_ranks(culprits) if culprits else "none",
            "culpritRanks": culprits[:256],
            "missingRanks": fmt_ranks(report.missing_ranks),
            "missingPods": [_clip(f"{pod}: {why}") for pod, why in sorted(missing_pods.items())][:MAX_LINES],
        },
    }
    evidence: dict[str, Any] = {
        "lines": [_clip(e) for e in (finding.evidence if finding else [])][:MAX_LINES],
        "culpritStacks": _stacks(finding) if finding else {},
        "consequences": [_clip(c.summary) for c in (finding.consequences if finding else [])][:MAX_LINES],
        "otherFindings": [_clip(f"{f.category.value}: {f.summary}") for f in report.findings[1:]][:MAX_LINES],
        "problems": [_clip(str(p)) for p in report.problems][:MAX_PROBLEMS],
    }
    obj: dict[str, Any] = {
        "apiVersion": f"{names.REPORT_GROUP}/{names.REPORT_VERSION}",
        "kind": names.REPORT_KIND,
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": {
                names.LABEL_REPORT_JOB: dns_name(job.name),
                names.LABEL_REPORT_INCIDENT: incident,
                names.LABEL_REPORT_STATE: (state or {}).get("phase", names.REPORT_STATE_CONFIRMED),
                "app.kubernetes.io/managed-by": names.COMPONENT,
            },
            "ownerReferences": [
                {"apiVersion": job.api_version, "kind": job.kind, "name": job.name, "uid": job.uid}
            ],
        },
        "diagnosis": diagnosis,
        "evidence": evidence,
        "job": {
            "name": job.name,
            "uid": job.uid,
            "attempt": attempt,
            "incident": incident,
            "signal": _clip(signal),
            "gatheredAt": gathered_at,
            "ranksGathered": len(report.ranks_loaded),
            "worldSize": report.world_size,
            "processGroupName": finding.process_group.name if finding else "",
        },
        "progress": progress_lines(report),
        "state": state or report_state(names.REPORT_STATE_CONFIRMED, "The stall was confirmed and diagnosed.",
                                       gathered_at),
    }
    if revision:
        obj["job"]["revision"] = revision
    if condition is not None:
        obj["job"]["condition"] = {"reason": condition[0], "message": condition[1]}
    if impact is not None:
        obj["impact"] = impact
    full = report_to_dict(report)
    keep = set(culprits) | set(report.missing_ranks[:64])
    trimmed, note = _trim_report(full, keep, limit_bytes, _size(obj) + 200)
    obj["report"] = trimmed
    if note:
        obj["job"]["reportTrimmed"] = note
    return obj


def report_state(phase: str, message: str, at: str) -> dict[str, str]:
    """A report's `state`: Suspected, Resumed or Confirmed (names.REPORT_STATE_*), since `at` (RFC 3339)."""
    return {"phase": phase, "message": _clip(message, 1024), "lastTransitionTime": at}


def state_patch(phase: str, message: str, at: str) -> dict[str, Any]:
    """The merge patch that moves a report to another state (its label follows)."""
    return {"metadata": {"labels": {names.LABEL_REPORT_STATE: phase}}, "state": report_state(phase, message, at)}


def build_suspicion_cr(job: JobRef, report: Report, *, signal: str, missing_pods: dict[str, str], at: str,
                       condition: tuple[str, str], message: str,
                       limit_bytes: int = DEFAULT_LIMIT_BYTES) -> dict[str, Any]:
    """The job's suspicion report (`<job>-suspicion`): what the gather at a suspected stall found, state
    Suspected. `job.suspicion` keeps it out of the ledger (it is no diagnosed incident)."""
    obj = build_report_cr(job, report, incident=names.SUSPICION_REPORT, attempt="", signal=signal,
                          missing_pods=missing_pods, gathered_at=at, limit_bytes=limit_bytes, condition=condition,
                          state=report_state(names.REPORT_STATE_SUSPECTED, message, at))
    obj["job"]["suspicion"] = True
    return obj


def is_suspicion_report(obj: dict[str, Any]) -> bool:
    job = obj.get("job")
    return isinstance(job, dict) and job.get("suspicion") is True
