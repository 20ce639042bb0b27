"""The `/v1/status` document (frscope.wire.StatusDoc): per rank and group progress, dump files and
evidence, cheap enough for the operator to poll every pod at a bounded rate."""

from __future__ import annotations

from frscope import wire
from frscope.analysis.lateness import RankLateness
from frscope.sidecar.config import SidecarConfig
from frscope.sidecar.dumpdir import DumpDirWatcher
from frscope.sidecar.evidence import EvidenceStore
from frscope.sidecar.progress import GroupSample, StallTracker
from frscope.sidecar.ranks import RankState
from frscope.sidecar.unrecorded import UnrecordedWatch
from frscope.wire import DumpFileDoc, GroupStatusDoc, LatenessDoc, RankStatusDoc, StatusDoc, UnrecordedWaitDoc


def _lateness_doc(found: RankLateness | None) -> LatenessDoc | None:
    if found is None:
        return None
    return {"group": found.group, "lateness_s": round(found.lateness_s, 4), "share": round(found.share, 4),
            "late": found.late, "compared": found.compared, "window_s": round(found.window_s, 3),
            "straggler": found.straggler}


def arrivals_doc(sample: GroupSample, each: int) -> list[list[int]]:
    """The group's newest `each` arrivals, [seq, enqueue ns] or, where the recorder dates it,
    [seq, enqueue ns, wait ns]."""
    if not each:
        return []
    waits = dict(sample.waits)
    return [[seq, ns, waits[seq]] if seq in waits else [seq, ns] for seq, ns in sample.arrivals[-each:]]


def _unrecorded_doc(watch: UnrecordedWatch | None, rank: int, now_ns: int) -> UnrecordedWaitDoc | None:
    """The rank's part in a hang the recorder cannot see (suspected or confirmed), else None."""
    if watch is None or not watch.suspected or rank not in watch.blocked:
        return None
    wait = watch.blocked[rank]
    return {"op": wait.op, "site": wait.site, "no_progress_s": round(watch.quiet_s(now_ns), 3),
            "suspected_since_ns": watch.suspected_since_ns, "stalled": watch.stalled,
            "stalled_since_ns": watch.stalled_since_ns, "usual_step_s": round(watch.usual_step_s, 3),
            "suspect_threshold_s": watch.threshold_s}


def status_document(config: SidecarConfig, ranks: dict[int, RankState], tracker: StallTracker,
                    evidence: EvidenceStore, dumps: DumpDirWatcher | None, last_round_ns: int | None,
                    now_ns: int, lateness: dict[int, RankLateness] | None = None,
                    unrecorded: UnrecordedWatch | None = None) -> StatusDoc:
    by_rank: dict[str, RankStatusDoc] = {}
    listed = sum(1 for rank in ranks for group in tracker.for_rank(rank).values() if group.sample.arrivals)
    each = wire.status_arrivals_each(listed)
    for rank, state in sorted(ranks.items()):
        groups: dict[str, GroupStatusDoc] = {}
        for pg, group in sorted(tracker.for_rank(rank).items()):
            sample = group.sample
            age = group.inflight_age_s(now_ns)
            groups[pg] = {
                "desc": sample.desc,
                "last_enqueued_seq": sample.last_enqueued_seq,
                "last_completed_seq": sample.last_completed_seq,
                "inflight_op": sample.inflight_op,
                "inflight_seq": sample.inflight_seq,
                "inflight_age_s": round(age, 3) if age is not None else None,
                "stalled": group.stalled,
                "stalled_since_ns": group.stalled_since_ns,
                "no_progress_s": round((now_ns - group.progress_ns) / 1e9, 3),
                "stall_threshold_s": group.threshold_s,
                "suspected": group.suspected,
                "suspected_since_ns": group.suspected_since_ns,
                "suspect_threshold_s": group.suspect_threshold_s,
                "usual_wait_s": round(group.rhythm.usual_wait_s, 3),
                "arrivals": arrivals_doc(sample, each),
            }
        by_rank[str(rank)] = {
            "up": state.up,
            "error": state.error,
            "last_poll_ns": state.last_poll_ns,
            "last_ok_ns": state.last_ok_ns,
            "recorder_ns": state.raw_ns,
            "progress_probe": (state.probe[0] or None) if state.probe is not None else None,
            "restart_count": restarts if isinstance(restarts := state.meta.get("restart_count"), int) else None,
            "groups": groups,
            "lateness": _lateness_doc((lateness or {}).get(rank)),
            "unrecorded_wait": _unrecorded_doc(unrecorded, rank, now_ns),
        }
    capture = evidence.latest()
    dump_files: list[DumpFileDoc] = []
    if dumps is not None:
        dump_files = [
            {"path": str(f.path), "rank": f.rank, "state": f.state, "entries": f.entries, "error": f.error}
            for f in sorted(dumps.files.values(), key=lambda f: str(f.path))
        ]
    return {
        "schema": wire.STATUS_SCHEMA,
        "pod": config.pod,
        "namespace": config.namespace,
        "node": config.node,
        "captured_at_ns": last_round_ns or now_ns,
        "answered_at_ns": now_ns,
        "stalled": any(g.stalled for g in tracker.groups.values()) or (unrecorded is not None and unrecorded.stalled),
        "suspected": any(g.suspected for g in tracker.groups.values()) or (
            unrecorded is not None and unrecorded.suspected),
        "ranks": by_rank,
        "dump_dir": {
            "path": str(config.dump_dir) if config.dump_dir else None,
            "exists": dumps.exists if dumps is not None else None,
            "files": dump_files,
        },
        "evidence": {
            "dir": str(config.evidence_dir) if config.evidence_dir else None,
            "captures_in_memory": len(evidence.memory),
            "files_on_disk": len(evidence.on_disk),
            "latest_capture_ns": capture.captured_at_ns if capture else None,
            "last_error": evidence.last_error,
        },
    }
