"""The ground truth and the plan: everything a writer needs to write every rank's dump (small enough to hand
to worker processes), and each rank's dump built from it (`Plan.dump`)."""


from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from frscope.testing.synthetic.steps import OpSpec, frames_for
from frscope.testing.synthetic.topology import (
    COMPLETED,
    NCCL_VERSION,
    NS_PER_MS,
    PP,
    ROLE_DESC,
    SCHEDULED,
    STARTED,
    STATE_NAMES,
    VERSION,
    Topology,
)


@dataclass(frozen=True)
class GroundTruth:
    """What a correct analyzer must say about the generated dumps."""

    scenario: str
    shape: str
    world_size: int
    tp: int
    pp: int
    dp: int
    category: str | None  # None: healthy, no finding
    culprit_ranks: tuple[int, ...]
    group_name: str | None = None
    group_desc: str | None = None
    group_ranks: tuple[int, ...] = ()
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    op: str | None = None
    missing_ranks: tuple[int, ...] = ()
    straggle_ms: float | None = None
    # Groups where the root cause shows up again (ranks absent or blocked there): not separate causes.
    consequence_groups: tuple[str, ...] = ()
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# the plan: everything a writer needs, small enough to hand to worker processes


@dataclass
class Plan:
    topo: Topology
    shape: str
    entries: int
    truth: GroundTruth
    templates: list[list[OpSpec]]  # per pipeline stage
    full_steps: int  # steps before the last (partial or hung) one
    last_step: dict[int, tuple[tuple[int, int], ...]]  # rank -> ((position, state code), ...)
    overrides: dict[int, dict[int, OpSpec]]  # rank -> position -> what that rank ran instead
    step_ns: int
    offsets_ns: list[int]
    first_step_ns: int  # creation time of step 0
    straggle_ns: dict[int, int]
    skew_ns: dict[int, int]  # per host (8 ranks a host)
    unretired: frozenset[int]  # gloo: ranks whose last entry is not yet retired (young)
    missing: frozenset[int]
    timeout_ms: int
    seed: int
    _group_straggle: dict[tuple[int, int], int] = field(default_factory=dict)
    # The profiling names' prefix when not the shape's own ('nccl2', 'ncclx', 'xccl', 'torchcomms', ...): every
    # comm library that records into torch's Flight Recorder names its ops '<library>:<op>'.
    comm_lib: str = ""

    # -- one rank ---------------------------------------------------------------------------

    def dump(self, rank: int, json_shape: bool = False, newest: int | None = None) -> dict[str, Any]:
        """The rank's recorder as torch returns it (`_dump_fr_trace` pickle shape, or the
        `_dump_fr_trace_json` shape when json_shape). `newest`: only the newest that many entries, as a
        sidecar's `/v1/snapshot?entries=N` serves them (the same as cutting the whole dump's entries,
        everything else unchanged; the older entries are counted, never built)."""
        topo = self.topo
        gloo = self.shape == "gloo"
        backend = self.comm_lib or self.shape
        stage = topo.local_rank(PP, rank) if topo.pp > 1 else 0
        template = self.templates[stage]
        n_pos = len(template)
        last = self.last_step.get(rank, ())
        full = self.full_steps * n_pos
        total = full + len(last)
        start = max(0, total - self.entries)

        main_tid = str(139_700_000_000_000 + (rank * 7_919 % 9_973) * 4_096)
        grad_tid = main_tid if gloo else str(int(main_tid) + 18_446_744)
        tname_main, tname_grad = "python", ("python" if gloo else "pt_autograd_0")
        rank_off = self.skew_ns.get(rank // 8, 0) + self.straggle_ns.get(rank, 0)
        skew = self.skew_ns.get(rank // 8, 0)
        roles = topo.roles
        pg_tuple = {
            role: (topo.group_name(role, topo.group_index(role, rank)), ROLE_DESC[role]) for role in roles
        }
        frames_cache: dict[tuple[str, str, bool], tuple[dict[str, Any], ...]] = {}

        def row(spec: OpSpec) -> tuple[Any, ...]:
            fkey = (spec.site, spec.op, spec.autograd)
            frames = frames_cache.get(fkey)
            if frames is None:
                frames = frames_cache[fkey] = frames_for(*fkey)
            role = spec.role
            return (
                topo.local_uid(role),
                pg_tuple[role],
                tname_grad if spec.autograd else tname_main,
                grad_tid if spec.autograd else main_tid,
                spec.profiling_name(backend),
                [list(s) for s in spec.in_sizes],
                list(spec.in_dtypes),
                [list(s) for s in spec.out_sizes],
                list(spec.out_dtypes),
                frames,
                spec.is_p2p,
                role,
                int(spec.dur_ms * NS_PER_MS),
                self._grp_straggle(role, rank),
            )

        rows = [row(spec) for spec in template]
        last_rows = list(rows)
        for pos, spec in self.overrides.get(rank, {}).items():
            last_rows[pos] = row(spec)

        # Counters as they stood just before the buffer's first record.
        coll = [0, 0, 0, 0]
        p2p = [0, 0, 0, 0]
        opid = [0, 0, 0, 0]
        before_full = min(start, full)
        steps_done, rem = divmod(before_full, n_pos)
        for pos, spec in enumerate(template):
            times = steps_done + (1 if pos < rem else 0)
            if spec.is_p2p:
                p2p[spec.role] += times
            else:
                coll[spec.role] += times
            opid[spec.role] += times
        for pos, _code in last[: max(0, start - full)]:
            spec = template[pos]
            if spec.is_p2p:
                p2p[spec.role] += 1
            else:
                coll[spec.role] += 1
            opid[spec.role] += 1
        last_started = [(p2p[r] if r == PP else coll[r]) or -1 for r in range(4)]
        last_completed = list(last_started)

        step_ns = self.step_ns
        t0 = self.first_step_ns
        offsets = self.offsets_ns
        last_step = self.full_steps
        rank_h = (rank * 2_654_435_761) & 0xFFFFFFFF
        timeout_ms = self.timeout_ms
        unretired_idx = total - 1 if rank in self.unretired else -1
        st_names = STATE_NAMES
        out: list[dict[str, Any]] = []
        append = out.append
        keep_from = max(start, total - newest) if newest is not None and newest > 0 else start
        for idx in range(start, total):
            if idx < full:
                step, pos = divmod(idx, n_pos)
                code = COMPLETED
                r = rows[pos]
            else:
                pos, code = last[idx - full]
                step = last_step
                r = last_rows[pos]
            (pgid, pgt, tname, tid, pname, insz, indt, outsz, outdt, frames, is_p2p, role, dur_ns, gstrag) = r
            if is_p2p:
                p2p[role] += 1
                seq = p2p[role]
            else:
                coll[role] += 1
                seq = coll[role]
            opid[role] += 1
            h = (rank_h ^ (idx * 40_503)) & 0xFFFFF
            nominal = t0 + step * step_ns + offsets[pos]
            created = nominal + rank_off + h % 150_000
            if gloo:
                state = st_names[SCHEDULED]
                started_ns = completed_ns = None
                duration = None
                retired = code == COMPLETED and idx != unretired_idx
                if retired:
                    last_completed[role] = seq
            else:
                state = st_names[code]
                retired = code == COMPLETED
                duration = None
                started_ns = completed_ns = None
                if code >= STARTED:
                    started_ns = created + 20_000 + h % 50_000
                    last_started[role] = seq
                    if code == COMPLETED:
                        completed_ns = nominal + skew + gstrag + 250_000 + dur_ns + h % 30_000
                        duration = (completed_ns - started_ns) / NS_PER_MS
                        last_completed[role] = seq
            if idx < keep_from:
                continue  # older than the window: counted above, not built
            if json_shape:
                e: dict[str, Any] = {
                    "record_id": idx,
                    "pg_id": pgid,
                    "process_group": list(pgt),
                    "thread_name": tname,
                    "thread_id": tid,
                    "collective_seq_id": coll[role],
                    "p2p_seq_id": p2p[role],
                    "op_id": opid[role],
                    "profiling_name": pname,
                    "time_created_ns": created,
                    "input_sizes": [list(s) for s in insz],
                    "input_dtypes": list(indt),
                    "output_sizes": [list(s) for s in outsz],
                    "output_dtypes": list(outdt),
                    "state": state,
                    "time_discovered_started_ns": started_ns or 0,
                    "time_discovered_completed_ns": completed_ns or 0,
                    "retired": retired,
                    "timeout_ms": timeout_ms,
                    "is_p2p": is_p2p,
                }
            else:
                e = {
                    "frames": list(frames),
                    "record_id": idx,
                    "pg_id": pgid,
                    "process_group": pgt,
                    "thread_name": tname,
                    "thread_id": tid,
                    "collective_seq_id": coll[role],
                    "p2p_seq_id": p2p[role],
                    "op_id": opid[role],
                    "profiling_name": pname,
                    "time_created_ns": created,
                    "input_sizes": [list(s) for s in insz],
                    "input_dtypes": list(indt),
                    "output_sizes": [list(s) for s in outsz],
                    "output_dtypes": list(outdt),
                    "state": state,
                    "time_discovered_started_ns": started_ns,
                    "time_discovered_completed_ns": completed_ns,
                    "retired": retired,
                    "timeout_ms": timeout_ms,
                    "is_p2p": is_p2p,
                }
            if duration is not None:
                e["duration_ms"] = duration
            append(e)

        pg_status: dict[str, dict[str, Any]] = {}
        for role in roles:
            enq = (p2p[role] if role == PP else coll[role]) or -1
            values: dict[str, Any] = {
                "last_enqueued_collective": enq,
                "last_started_collective": -1 if gloo else last_started[role],
                "last_completed_collective": last_completed[role],
            }
            if json_shape:
                values = {k: str(v) for k, v in values.items()}
            pg_status[str(topo.local_uid(role))] = values

        if gloo:
            pg_config: dict[str, dict[str, str]] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        else:
            pg_config = {}
            for role in roles:
                index = topo.group_index(role, rank)
                name = topo.group_name(role, index)
                pg_config[name] = {
                    "name": name,
                    "desc": ROLE_DESC[role],
                    "ranks": str(list(topo.members(role, index))),
                }
        dump: dict[str, Any] = {
            "version": VERSION,
            "pg_config": pg_config,
            "comm_lib_version": "" if gloo else NCCL_VERSION,
            "pg_status": pg_status,
        }
        if json_shape:
            dump["nccl_comm_state"] = {}
            if out:
                dump["entries"] = out
        else:
            dump["entries"] = out
        return dump

    def dump_length(self, rank: int) -> int:
        """How many entries `dump(rank)` holds (the ring buffer's fill), without building them."""
        stage = self.topo.local_rank(PP, rank) if self.topo.pp > 1 else 0
        total = self.full_steps * len(self.templates[stage]) + len(self.last_step.get(rank, ()))
        return min(total, self.entries)

    def _grp_straggle(self, role: int, rank: int) -> int:
        """The latest straggle among the members of `rank`'s group of `role` (everyone waits for it)."""
        if not self.straggle_ns:
            return 0
        key = (role, self.topo.group_index(role, rank))
        got = self._group_straggle.get(key)
        if got is None:
            got = max(
                self.straggle_ns.get(m, 0) + self.skew_ns.get(m // 8, 0) - self.skew_ns.get(rank // 8, 0)
                for m in self.topo.members(role, key[1])
            )
            got = max(got, self.straggle_ns.get(rank, 0))
            self._group_straggle[key] = got
        return got

    def ranks_to_write(self) -> list[int]:
        return [r for r in range(self.topo.world) if r not in self.missing]


# ---------------------------------------------------------------------------------------------
# simulation of the last step
