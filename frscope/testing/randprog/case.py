"""One random case from a seed: layout, program, fault, execution, truth, and the capture in three forms
(torch's pickle and JSON files, as copies or with their write times as mtimes, and sidecar snapshots
with live stacks and the capture time), written to a folder."""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

from frscope import wire
from frscope.testing.randprog import torchpickle
from frscope.testing.randprog.executor import BLOCKED, DONE, EXITED, FAILED, STUCK, Execution, Rdv, execute
from frscope.testing.randprog.faults import Fault, apply_fault
from frscope.testing.randprog.layout import DEFAULT, random_layout
from frscope.testing.randprog.program import Program, random_program
from frscope.testing.randprog.recorder import dump, ns
from frscope.testing.randprog.stacks import stack_text
from frscope.testing.randprog.truth import FEW_STEPS, FILE_FORMS, STRAGGLER, Truth, late_recorded, truth_of, waits_on

FORMS = ("snapshot", "pickle", "json")
POLL_S = 0.3  # how often a sidecar reads a rank's recorder
NO_DUMP_WHY = "the rank crashed without a dump and no exit code was passed: nothing says it ever existed"
STALE_COPIED_WHY = ("one rank's recorder was read steps before its peers' and the files are copies: when each "
                    "was read is lost, so a read taken early and the last dump of a rank that stopped leave the "
                    "same files")
STALE_GLOO_WHY = ("one rank's recorder was read steps before its peers', whose recorders show every op retired: "
                  "on gloo a crash after that read leaves the same files (its peers fail at once and gloo retires "
                  "the failed op); the exit codes or live stacks decide")
NO_TORCH_FRAME_WHY = ("the waiting ranks sit in Work.wait() of unrecorded ops (batch_isend_irecv, async ops): a C++ "
                      "call, so their stacks' top frame is their own Python, like the culprit's")
BATCH_LOOKALIKE_WHY = ("a rank that is no culprit sits in Work.wait() of a batch_isend_irecv (gloo records none of "
                       "its ops): a C++ call, so its stack's top frame is its own Python, as if it were stuck there, "
                       "and others wait on it, or on someone no recorded wait names")
DIED_GLOO_WHY = ("gloo, no exit codes: the survivors failed at once when the rank went away and gloo retired the "
                 "failed op, so every recorder shows every op retired and the rank's recorder ends early: a healthy "
                 "job whose rank was read early leaves the same files; the exit codes or live stacks decide")
DIED_NCCL_WHY = ("NCCL, no exit code: the rank's process ended inside an op every member entered; its dump shows the "
                 "op in flight like its peers' (they wait in it for a member that is gone), which a device or "
                 "network hang of that op leaves too; the exit codes or the collector's word decide")
UNSEEN_MEMBER_WHY = ("gloo names no subgroup's members, and the rank the others wait on in a subgroup never recorded "
                     "anything of it: the waiting ranks' entries show every member but it, and other ranks that "
                     "recorded nothing of it either look just as it does (idle, or in Python), so any of them may "
                     "be the member that never came")
EVICTED_WHY = "the ring buffer wrapped: a rank's entry of the collective where the ranks disagreed is gone"
def late_steps_needed(ranks: int) -> int:
    """How many late steps a ring must still show of a straggler whose lateness shows in collectives of
    `ranks` ranks: most of FEW_STEPS, and enough that jitter would make one rank the last at every one of
    them less than once in a hundred runs (a given step's last is each rank's by 1 in n: any rank k of k
    times, n * n**-k), else FEW_STEPS (five late steps of one length: a cause repeating, not jitter). Two,
    three or four ranks need five; six, four."""
    needed = math.ceil(0.6 * FEW_STEPS)
    while needed < FEW_STEPS and ranks * float(ranks) ** -needed >= 0.01:
        needed += 1
    return needed


RING_WHY = ("the recorders' ring buffers wrapped: what they still hold covers, or shows the straggler late at, "
            "fewer steps than it takes to tell it from jitter")
UNRECORDED_WHY = ("gloo records no point-to-point op (send/recv, batch_isend_irecv, monitored_barrier): "
                  "without live stacks the recorders cannot show who started the wait")
UNRECORDED_GONE_WHY = ("gloo records no point-to-point op, and every process had ended by the capture: the "
                       "snapshot holds no live stack, only the reads the files hold (and that each process is gone)")
UNRECORDED_ENDED_WHY = ("gloo records no point-to-point op, and every rank the wait involved had ended by the "
                        "capture (the first to go and the peers that failed on its death, none with an error that "
                        "blames a peer); the live ranks had finished their programs, so no live stack shows a wait "
                        "or where a rank stuck: of the ended ones the snapshot holds only the reads the files hold "
                        "(and that each process is gone)")


@dataclass(slots=True)
class Case:
    seed: int
    program: Program
    fault: Fault
    ex: Execution
    truth: Truth
    capture_t: float  # seconds into the run when the live ranks were read
    version: str
    copied: bool  # the file forms are copies: their mtimes are the copy's, hours later
    exits: dict[int, int]
    dump_t: dict[str, dict[int, float]]  # form -> rank -> when its recorder was read
    buffer: int  # the recorder's ring size (TORCH_FR_BUFFER_SIZE)

    @property
    def hung(self) -> bool:
        return any(st.status in (BLOCKED, STUCK) for st in self.ex.states.values())

    def undecidable(self, form: str) -> str:
        why = self.truth.undecidable.get(form, "")
        if why:
            return why
        if self.truth.via_unrecorded and self.program.backend == "gloo":
            if form in FILE_FORMS:
                return UNRECORDED_WHY
            if all(st.status in (EXITED, FAILED) for st in self.ex.states.values()):
                return UNRECORDED_GONE_WHY
            if self._ended_without_live_waiter():
                return UNRECORDED_ENDED_WHY
            waiting = [st.block_op for st in self.ex.states.values() if st.status == BLOCKED]
            if waiting and all(op is not None and op.kind in ("wait", "batch") for op in waiting):
                return NO_TORCH_FRAME_WHY
            # a rank that looks like the culprit in the recorders, waiting on a request whose stack shows only
            # the user's frame (work.wait() is a C++ call): its stack looks like the culprit's too
            if any((op := self.ex.states[r].block_op) is not None and op.kind in ("wait", "batch")
                   for r in self.truth.lookalikes):
                return NO_TORCH_FRAME_WHY
            if self._batch_waiter_waited_on():
                return BATCH_LOOKALIKE_WHY
        if self._unseen_member_alike(form):
            return UNSEEN_MEMBER_WHY
        rdv = self.truth.mismatch_at
        if rdv is not None:
            for rank in rdv.recs:
                tv = self.dump_t[form].get(rank)
                seen = [e for e in self.ex.states[rank].issued if tv is not None and e.t_created <= tv]
                if not any(e.rdv is rdv for e in seen[-self.buffer:]):
                    return EVICTED_WHY
        if self.truth.category == STRAGGLER:
            kept, late, ranks = self._steps_kept(form)
            if kept < FEW_STEPS or late < late_steps_needed(ranks):
                return RING_WHY
        if (form in FILE_FORMS and self.truth.category == "healthy" and self.program.backend == "gloo"
                and self.fault.name == "stale_read"):
            return STALE_GLOO_WHY
        if form in FILE_FORMS and self.copied and self.fault.name == "stale_read":
            return STALE_COPIED_WHY
        if self._all_retired_without_exits(form):
            return DIED_GLOO_WHY
        if form in FILE_FORMS and self.truth.category != "healthy":
            gone = [r for r in self.truth.culprits if r not in self.dump_t[form]]
            if gone and not all(r in self.exits for r in gone):
                return NO_DUMP_WHY
            if self._died_in_flight(form):
                return DIED_NCCL_WHY
        return ""

    def _ended_without_live_waiter(self) -> bool:
        """No live rank waits or is stuck (each finished its program), and besides the culprits other ranks ended
        too (they failed on the culprit's death), and nothing sets the culprits apart from them: the exit codes
        (where passed) are alike, and the culprits' last reads hold every collective of theirs that any other
        rank's read holds (a read older than that shows a rank that stopped first). Which of the ended ranks went
        first then shows neither in a live stack nor in a recorder (the waits were in ops gloo does not record)."""
        states = self.ex.states
        culprits = set(self.truth.culprits)
        ended = {r for r, st in states.items() if st.status in (EXITED, FAILED)}
        if any(st.status in (BLOCKED, STUCK) for st in states.values()) or not culprits <= ended or ended == culprits:
            return False
        if self.exits and len({self.exits.get(r) for r in ended}) > 1:
            return False
        read = self.dump_t["snapshot"]

        def held(rank: int) -> set[int]:
            tv = read.get(rank, -1.0)
            return {id(e.rdv) for e in states[rank].issued if e.t_created <= tv and not isinstance(e.rdv, tuple)
                    and not e.p2p_name}

        mine = {r: held(r) for r in read}
        for culprit in culprits:
            own = {id(e.rdv) for e in states[culprit].issued if not isinstance(e.rdv, tuple)}
            theirs = set().union(*(mine[r] for r in read if r not in culprits)) & own
            if theirs - mine[culprit]:
                return False
        return True

    def _unseen_member_alike(self, form: str) -> bool:
        """gloo, a rank stuck in Python: every recorded wait that names it is a collective of a subgroup its
        recorder shows nothing of (gloo's pg_config names no subgroup's members, so the waiting ranks' entries
        show every member but it), and another rank that recorded nothing of that subgroup, and whose own group
        numbers leave room for it (pg_status), looks like it in this form: idle in the recorders (or in Python,
        or in a call whose stack shows only the user's frame, in a snapshot)."""
        if self.program.backend != "gloo" or self.truth.category != "RankNotJoined":
            return False
        layout, read = self.program.layout, self.dump_t[form]
        states = self.ex.states

        def recorded(rank: int, group: int) -> bool:
            tv = read.get(rank)
            return tv is not None and any(e.group == group and e.t_created <= tv for e in states[rank].issued)

        for culprit in self.truth.culprits:
            if states[culprit].status != STUCK:
                return False
            groups = {x.group for st in states.values() if st.status == BLOCKED for x in st.blocked
                      if x.key[0] == "c" and culprit in waits_on(x)}
            if not groups or any(layout.groups[g].style == DEFAULT or recorded(culprit, g) for g in groups):
                return False
            for group in groups:
                alike = [r for r in read if not recorded(r, group) and self._may_belong(form, r, group)
                         and self._looks_idle(form, r)]
                if culprit in alike and len(alike) > 1:
                    return True
        return False

    def _may_belong(self, form: str, rank: int, group: int) -> bool:
        """What frscope may read from the rank's pg_status: its groups numbered 0, 1, ... in creation order,
        listed from their first recorded op. Where its numbers run without a gap and it recorded in a group
        created after `group`, that group would hold an unlisted number below: it is no member."""
        tv = self.dump_t[form].get(rank, -1.0)
        mine = self.program.layout.member_groups(rank)
        used = {g.index for e in self.ex.states[rank].issued if e.t_created <= tv for g in mine if g.index == e.group}
        numbers = {i for i, g in enumerate(mine) if g.index in used} | {0}
        return numbers != set(range(max(numbers) + 1)) or not any(g > group for g in used)

    def _looks_idle(self, form: str, rank: int) -> bool:
        st = self.ex.states[rank]
        if st.status in (STUCK, DONE):
            return True
        if st.status != BLOCKED:
            return False
        if form == "snapshot":
            return st.block_op is not None and st.block_op.kind in ("batch", "wait")
        return not any(x.key[0] == "c" for x in st.blocked)

    def _batch_waiter_waited_on(self) -> bool:
        """A rank that is no culprit waits in a batch of sends and receives (gloo records none of them) and
        another rank waits on it: its stack shows only its own Python (work.wait() is a C++ call), exactly
        as a rank stuck in Python there, and every recorder is the same either way: the same capture comes
        from a run where it is the sink the others wait for. Likewise where nobody waits on it but no wait
        the recorders keep names the culprit (the waits that reach it are all in ops gloo does not record,
        whose stacks name no peer): the ranks in those ops may as well wait on it, so the capture is also the
        one a run with it stuck in Python leaves (the culprit then waiting in a C++ call of its own)."""
        blocked = {r: st for r, st in self.ex.states.items() if st.status == BLOCKED}
        alike = {r for r, st in blocked.items()
                 if st.block_op is not None and st.block_op.kind == "batch" and r not in self.truth.culprits}
        # (who waits on it does not matter: a rank waiting in a batch too looks the same either way)
        waited = {w for r, st in blocked.items() for x in st.blocked for w in waits_on(x) if w != r}
        return bool(alike & waited) or (bool(alike) and not self.truth.named)

    def _steps_kept(self, form: str) -> tuple[int, int, int]:
        """What the rings still hold of a straggler (every participant's entry of a collective kept): the
        fewest steps any culprit has a collective of, the fewest at which its lateness shows, and the fewest
        ranks of the collectives that show it at each of those steps. Large numbers where no ring wrapped."""
        held: dict[int, set[int]] = {}
        for rank, tv in self.dump_t[form].items():
            issued = [e for e in self.ex.states[rank].issued if e.t_created <= tv]
            if len(issued) > self.buffer:
                held[rank] = {id(e.rdv) for e in issued[-self.buffer:]}
        if not held:
            return 1 << 30, 1 << 30, 1 << 30

        def kept(rdv: Rdv) -> bool:
            return all(id(rdv) in held[r] for r in rdv.arrivals if r in held)

        culprits = set(self.truth.culprits)
        steps = min(len({e.op.step for e in self.ex.states[r].issued if not isinstance(e.rdv, tuple)
                         and len(e.rdv.arrivals) > 1 and not e.p2p_name and kept(e.rdv)})
                    for r in culprits)
        late = [late_recorded(self.ex, r, culprits, kept) for r in culprits]
        return steps, min(map(len, late)), min((n for by_step in late for n in by_step.values()), default=2)

    def _died_in_flight(self, form: str) -> bool:
        """NCCL, no exit code for the culprit: its process ended inside an op every member entered, and
        every member's recorder of the form holds that op (not finished, like the dead rank's own)."""
        if self.program.backend != "nccl" or any(r in self.exits for r in self.truth.culprits):
            return False
        for rdv in self.ex.rdvs:
            if rdv.outcome == "dead" and set(rdv.dead) & set(self.truth.culprits) and all(
                    self._holds(form, m, rdv) for m in rdv.expected):
                return True
        return False

    def _holds(self, form: str, rank: int, rdv: Rdv) -> bool:
        tv = self.dump_t[form].get(rank)
        return tv is not None and any(
            e.t_created <= tv and (e.rdv is rdv or (isinstance(e.rdv, tuple) and rdv in e.rdv))
            for e in self.ex.states[rank].issued)

    def _all_retired_without_exits(self, form: str) -> bool:
        """gloo, no exit codes, nobody left waiting (the survivors failed at once and exited), and every
        recorder of the form shows every op retired: the stale read's files (STALE_GLOO_WHY) seen from
        the other side. A snapshot is no better where every process ended: no live stack, only reads."""
        if self.program.backend != "gloo" or self.exits or self.hung or not self.truth.culprits:
            return False
        if form == "snapshot" and not all(st.status in (EXITED, FAILED) for st in self.ex.states.values()):
            return False
        if form in FILE_FORMS and any(r not in self.dump_t[form] for r in self.truth.culprits):
            return False  # no dump of the culprit: NO_DUMP_WHY says why
        if not all(self.ex.states[r].status == EXITED for r in self.truth.culprits):
            return False
        return all(e["retired"] for r, tv in self.dump_t[form].items()
                   for e in dump(self.ex, r, tv, pickle=False, buffer=self.buffer)["entries"])


def make_case(seed: int, fault: str | None = None) -> Case:
    rng = random.Random(seed)
    layout = random_layout(rng)
    program = random_program(rng, layout)
    flt = apply_fault(rng, program, fault)
    ex = execute(program, rng)
    truth = truth_of(ex)
    hung = any(st.status in (BLOCKED, STUCK) for st in ex.states.values())
    capture = ex.end_t + (rng.uniform(20, 900) if hung else rng.uniform(0.01, 0.5))
    version = rng.choices(("2.10", "2.4", "2.2"), (8, 1, 1))[0]
    copied = rng.random() < 0.5
    buffer = 2000 if rng.random() < 0.88 else rng.randint(8, 40)
    exited = {r: st for r, st in ex.states.items() if st.status in (EXITED, FAILED)}
    aborted = any(r.outcome == "abort" for r in ex.rdvs)
    exits = {r: st.code for r, st in exited.items()} if (flt.exits_known or aborted) else {}
    dump_t: dict[str, dict[int, float]] = {f: {} for f in FORMS}
    for r, st in ex.states.items():
        if st.status not in (EXITED, FAILED):
            for f in FORMS:
                dump_t[f][r] = capture + 0.0007 * r
                if flt.name == "stale_read" and r in flt.ranks:
                    # read just before its compute of that step ended (the step's first op not yet issued)
                    dump_t[f][r] = st.last_step_t.get(flt.step, capture) - 1e-6
            continue
        # the sidecar's last poll, unless the rank wrote a dump as it died (its dump-dir watcher reads it)
        dump_t["snapshot"][r] = max(0.0, st.t - rng.uniform(0, POLL_S))
        when: float | None = None
        if flt.dump == "periodic" and r in flt.ranks and st.block_op is not None:
            earlier = max(1, st.block_op.step - flt.stale_steps)
            when = st.last_step_t.get(earlier, 0.0) - 1e-6
        elif st.dump_at_exit:
            when = st.t + 0.001
        if when is not None:
            for f in FILE_FORMS:
                dump_t[f][r] = when
            if st.dump_at_exit:
                dump_t["snapshot"][r] = when
    return Case(seed, program, flt, ex, truth, capture, version, copied, exits, dump_t, buffer)


def _gone_envelope(case: Case, rank: int, read_t: float, trace: object) -> bytes:
    """What a sidecar holds for a rank whose process has gone: its last good read (no stacks) and the
    collector's word that the worker socket went with the process, as a pod's snapshot envelope."""
    ex = case.ex
    piece = wire.snapshot_piece_bytes(rank, ns(ex, read_t), "randprog", None,
                                      json.dumps(trace, separators=(",", ":")).encode())
    head = wire.snapshot_head(pod=f"randprog-{rank}", namespace="randprog", node="randprog",
                              captured_at_ns=ns(ex, case.capture_t), reason="exit")
    gone: wire.SnapshotError = {"rank": rank, "message": f"rank {rank}: fr_trace_json: socket is gone"}
    return wire.snapshot_envelope_bytes(head, [piece], [gone])


def write_form(case: Case, form: str, folder: Path) -> list[Path]:
    """The form's files for every rank that has one; mtimes as the capture left them."""
    folder.mkdir(parents=True, exist_ok=True)
    ex, paths = case.ex, []
    later_ns = ns(ex, case.capture_t) + int(3600e9 * (1 + case.seed % 47))
    for r, tv in sorted(case.dump_t[form].items()):
        if form == "snapshot":
            trace = dump(ex, r, tv, pickle=False, version=case.version, buffer=case.buffer)
            st = ex.states[r]
            path = folder / f"rank-{r}.json"
            if st.status in (EXITED, FAILED):
                path.write_bytes(_gone_envelope(case, r, tv, trace))
            else:
                piece = {"frscope_snapshot": 1, "rank": r, "source": "randprog", "captured_at_ns": ns(ex, tv),
                         "stacks": stack_text(st), "trace": trace}
                path.write_text(json.dumps(piece, separators=(",", ":")))
        elif form == "pickle":
            path = folder / f"comm_lib_trace_rank_{r}"
            path.write_bytes(torchpickle.dumps(dump(ex, r, tv, pickle=True, version=case.version, buffer=case.buffer)))
        else:
            path = folder / f"trace_rank_{r}.json"
            path.write_text(json.dumps(dump(ex, r, tv, pickle=False, version=case.version, buffer=case.buffer),
                                       sort_keys=True, separators=(",", ":")))
        if form != "snapshot":
            when = later_ns if case.copied else ns(ex, tv)
            os.utime(path, ns=(when, when))
        paths.append(path)
    return paths


def describe(case: Case) -> str:
    ex, layout = case.ex, case.program.layout
    lines = [f"seed {case.seed}: world {layout.world}, {case.program.backend}, format {case.version}, "
             f"ring {case.buffer}"
             + (", file forms copied" if case.copied else ""),
             "groups: " + "; ".join(f"{g.name} {g.desc} {list(g.ranks)}" for g in layout.groups),
             *case.program.notes,
             f"fault: {case.fault.name} ranks {list(case.fault.ranks)} step {case.fault.step} {case.fault.detail}",
             "final: " + ", ".join(f"{r} {st.status}" + (f" {st.blocked[0].key}" if st.blocked else "")
                                   + (f" code {st.code}" if st.status in (EXITED, FAILED) else "")
                                   for r, st in sorted(ex.states.items())),
             f"truth: {case.truth.category} {list(case.truth.culprits)} ({case.truth.why})"
             + (f"; exits {case.exits}" if case.exits else "")]
    return "\n".join(lines)
