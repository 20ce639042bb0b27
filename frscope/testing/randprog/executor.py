"""A discrete-event executor for a Program: when each rank issues each op, when each rendezvous completes,
and where every rank is at the end, with gloo's or NCCL's semantics.

Matching is what the backends do: the k-th collective a rank issues on a group meets every member's k-th
(whatever its kind); a group's collectives complete in issue order (one work queue per group); a
point-to-point op meets the peer's n-th op of the other direction between the same two ranks. At a
collective every member joined: different ops never complete (a type mismatch hangs every rank); the
same op with other shapes or dtypes completes silently when the byte counts agree; when they differ,
gloo aborts every member at once (the ranks of the common shape die with SIGABRT and leave no dump,
the odd rank fails on its peers' reset connection) and NCCL hangs. On NCCL a rank's Python goes on after
enqueuing an op (the stream waits, not the CPU) until the step's sync point (`loss.item()`), except for
the object collectives and DDP's bucket sync, which read their result on the CPU.

Sequence ids as torch 2.13 keeps them (verified on gloo, see tests/unit/test_randprog_fidelity.py):
`collective_seq_id` per group advances on each recorded collective and by two on `monitored_barrier`
(which records nothing); `op_id` per group on every op, point-to-point included (`monitored_barrier`:
two per peer on the root, two elsewhere); `p2p_seq_id` only on NCCL's point-to-point ops (gloo records
none); `record_id` per rank over all groups.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from frscope.testing.randprog.program import Op, Program, Rec

RUN, BLOCKED, STUCK, EXITED, DONE = "run", "blocked", "stuck", "exited", "done"
# gloo: a rank whose collective or p2p op failed because a member's process is gone (the connection
# reset): it raised and exited 1; `blocked` still names the op it failed in.
FAILED = "failed"
# NCCL ops return to Python once enqueued (the CPU goes on; a step's sync point waits), except these,
# which read a result on the CPU (the object collectives' sizes, DDP's bucket order).
CPU_SYNC = frozenset({"all_gather_object", "broadcast_object_list", "_sync_bucket_indices"})


@dataclass(slots=True, eq=False)
class Rdv:
    """A rendezvous: a collective's k-th position on a group, a p2p message, or a monitored barrier."""

    key: tuple[Any, ...]
    expected: frozenset[int]
    arrivals: dict[int, float] = field(default_factory=dict)
    recs: dict[int, Rec] = field(default_factory=dict)
    prev: Rdv | None = None
    after: list[Rdv] = field(default_factory=list)  # NCCL p2p: earlier ops on a member's stream to the peer
    done: float | None = None
    outcome: str = ""  # ok | silent | hang_type | hang_size | abort | dead
    dead: frozenset[int] = frozenset()  # NCCL, outcome dead: the members whose process ended before it finished

    @property
    def group(self) -> int:
        return int(self.key[1])

    @property
    def missing(self) -> frozenset[int]:
        return self.expected - self.arrivals.keys()


@dataclass(slots=True)
class Issued:
    """One entry a rank recorded."""

    group: int
    rec: Rec | None  # None: an NCCL point-to-point entry (see p2p_name)
    p2p_name: str
    coll_seq: int
    p2p_seq: int
    op_id: int
    record_id: int
    t_created: float
    rdv: Rdv | tuple[Rdv, ...]
    op: Op

    def done_at(self) -> float | None:
        rdvs = self.rdv if isinstance(self.rdv, tuple) else (self.rdv,)
        times = [r.done for r in rdvs]
        return None if any(t is None for t in times) else max(t for t in times if t is not None)


@dataclass(slots=True)
class RankState:
    rank: int
    pc: int = 0
    sub: int = 0
    t: float = 0.0
    status: str = RUN
    blocked: list[Rdv] = field(default_factory=list)
    block_op: Op | None = None
    block_rec: Rec | None = None
    outstanding: list[Rdv] = field(default_factory=list)
    code: int = 0
    dump_at_exit: bool = False
    coll_seq: dict[int, int] = field(default_factory=dict)
    p2p_seq: dict[int, int] = field(default_factory=dict)
    op_id: dict[int, int] = field(default_factory=dict)
    pos: dict[int, int] = field(default_factory=dict)
    mpos: dict[int, int] = field(default_factory=dict)
    pairs: dict[tuple[int, int], int] = field(default_factory=dict)
    issued: list[Issued] = field(default_factory=list)
    # per group: (last op_id of an op, its rendezvous(es), issue time) for pg_status
    ops_log: dict[int, list[tuple[int, tuple[Rdv, ...], float]]] = field(default_factory=dict)
    records: int = 0
    last_step_t: dict[int, float] = field(default_factory=dict)  # step -> when its compute ended


@dataclass(slots=True)
class Execution:
    program: Program
    states: dict[int, RankState]
    rdvs: list[Rdv]
    end_t: float  # the last thing that happened
    t0_ns: int


def _duration(rec: Rec | None, size: int) -> float:
    return 0.0002 + (rec.nbytes if rec else 4096) * max(1, size) / 4e9


class Executor:
    def __init__(self, program: Program, rng: random.Random, deaths: dict[int, float] | None = None,
                 jitter: dict[int, list[float]] | None = None) -> None:
        self.p = program
        self.rng = rng
        # NCCL: when each rank's process ended (a second pass, once the first found it): an op can finish
        # only while every member's process lives (its kernel needs every member's device and proxy).
        self.deaths = deaths or {}
        self.states = {r: RankState(r) for r in program.ops}
        self.coll: dict[tuple[int, int], Rdv] = {}
        self.other: dict[tuple[object, ...], Rdv] = {}
        self.rdvs: list[Rdv] = []
        self.streams: dict[tuple[int, int, int], Rdv] = {}  # (rank, group, peer) -> its last p2p op there
        self.jitter = jitter if jitter is not None else {
            r: [rng.uniform(0.97, 1.03) for _ in range(program.steps + 2)] for r in program.ops}

    # -- rendezvous ---------------------------------------------------------------------------------------

    def _coll_rdv(self, group: int, pos: int) -> Rdv:
        rdv = self.coll.get((group, pos))
        if rdv is None:
            members = frozenset(self.p.layout.groups[group].ranks)
            rdv = Rdv(("c", group, pos), members, prev=self.coll.get((group, pos - 1)))
            self.coll[(group, pos)] = rdv
            self.rdvs.append(rdv)
        return rdv

    def _rdv(self, key: tuple[object, ...], members: frozenset[int]) -> Rdv:
        rdv = self.other.get(key)
        if rdv is None:
            rdv = Rdv(key, members)
            self.other[key] = rdv
            self.rdvs.append(rdv)
        return rdv

    def _peers_died(self) -> bool:
        """gloo: every op that waits for a rank whose process is gone fails at once on the ranks that
        entered it (the connection resets); they raise and exit 1, their handler dumping the recorder,
        where gloo has retired the failed entry as if it had succeeded."""
        if self.p.backend != "gloo":
            return False
        changed = False
        gone = {r: st.t for r, st in self.states.items() if st.status in (EXITED, FAILED)}
        if not gone:
            return False
        for st in self.states.values():
            if st.status != BLOCKED:
                continue
            for rdv in st.blocked:
                dead = [r for r in rdv.missing if r in gone]
                if rdv.done is None and dead:
                    st.t = max(st.t, min(gone[r] for r in dead)) + 0.005
                    st.status, st.code, st.dump_at_exit, st.blocked = FAILED, 1, True, [rdv]
                    changed = True
                    break
        return changed

    def _try_complete(self) -> bool:
        changed = self._peers_died()
        for rdv in self.rdvs:
            if rdv.done is not None or rdv.outcome or rdv.missing:
                continue
            if rdv.prev is not None and rdv.prev.done is None:
                continue
            if any(dep.done is None for dep in rdv.after):
                continue
            last = max(rdv.arrivals.values())
            if rdv.prev is not None and rdv.prev.done is not None:
                last = max(last, rdv.prev.done)
            size = len(rdv.expected)
            if rdv.key[0] == "c":
                recs = list(rdv.recs.values())
                if len({r.op for r in recs}) > 1:
                    rdv.outcome = "hang_type"
                    changed = True
                    continue
                if len({(r.payload, r.dtype) for r in recs}) > 1:
                    if len({r.payload_bytes for r in recs}) > 1:
                        rdv.outcome = "abort" if self.p.backend == "gloo" else "hang_size"
                        if rdv.outcome == "abort":
                            self._abort(rdv, last)
                        changed = True
                        continue
                    rdv.outcome = "silent"
                rdv.done = last + _duration(recs[0], size)
            else:
                rdv.done = last + _duration(None, size)
            dead = frozenset(m for m in rdv.expected if self.deaths.get(m, rdv.done) < rdv.done)
            if dead:  # a member's process ended before it finished: it never does (NCCL; gloo fails it)
                rdv.done, rdv.outcome, rdv.dead = None, "dead", dead
                changed = True
                continue
            rdv.outcome = rdv.outcome or "ok"
            changed = True
        return changed

    def _abort(self, rdv: Rdv, when: float) -> None:
        """gloo with different byte counts: the ranks of the common signature abort in gloo (SIGABRT, no
        dump); the odd ones fail on the reset connection (exit 1, their exception handler dumps)."""
        counts: dict[tuple[object, ...], int] = {}
        for rec in rdv.recs.values():
            counts[(rec.payload, rec.dtype)] = counts.get((rec.payload, rec.dtype), 0) + 1
        common = max(counts.items(), key=lambda kv: kv[1])[0]
        for rank, rec in rdv.recs.items():
            st = self.states[rank]
            st.status, st.blocked = EXITED, []
            st.t = when + 0.002
            if (rec.payload, rec.dtype) == common:
                st.code, st.dump_at_exit = -6, False
            else:
                st.code, st.dump_at_exit = 1, True

    # -- ranks --------------------------------------------------------------------------------------------

    def _bump(self, table: dict[int, int], group: int, by: int = 1) -> int:
        table[group] = table.get(group, 0) + by
        return table[group]

    def _log(self, st: RankState, group: int, op_id: int, rdvs: tuple[Rdv, ...]) -> None:
        st.ops_log.setdefault(group, []).append((op_id, rdvs, st.t))

    def _record(self, st: RankState, group: int, rec: Rec | None, p2p_name: str, op: Op,
                rdv: Rdv | tuple[Rdv, ...], coll: bool) -> None:
        coll_seq = self._bump(st.coll_seq, group) if coll else st.coll_seq.get(group, 0)
        p2p_seq = st.p2p_seq.get(group, 0) if coll else self._bump(st.p2p_seq, group)
        op_id = self._bump(st.op_id, group)
        st.issued.append(Issued(group, rec, p2p_name, coll_seq, p2p_seq, op_id, st.records, st.t, rdv, op))
        st.records += 1
        self._log(st, group, op_id, rdv if isinstance(rdv, tuple) else (rdv,))

    def _p2p_rdv(self, st: RankState, group: int, src: int, dst: int, stream: list[Rdv] | None = None) -> Rdv:
        """The message src -> dst this rank's op takes part in. On NCCL a rank's ops to one peer run in
        order on one stream: the op waits for the rank's previous one there (`stream`, the batch's own
        posts excepted), so two ranks that both receive first deadlock as they do on gloo."""
        n = st.pairs.get((src, dst), 0)
        st.pairs[(src, dst)] = n + 1
        rdv = self._rdv(("p", group, src, dst, n), frozenset((src, dst)))
        if self.p.backend == "nccl":
            peer = dst if src == st.rank else src
            last = self.streams.get((st.rank, group, peer))
            if last is not None and last is not rdv and not (stream and last in stream):
                rdv.after.append(last)
            self.streams[(st.rank, group, peer)] = rdv
        return rdv

    def _step(self, st: RankState, op: Op) -> None:
        """Issue `op` on `st` (its time is st.t); leaves the rank running, blocked, stuck or exited."""
        layout, nccl = self.p.layout, self.p.backend == "nccl"
        if op.kind == "compute":
            st.t += op.seconds * self.jitter[st.rank][min(op.step, self.p.steps + 1)]
            st.last_step_t[op.step] = st.t
            st.pc += 1
        elif op.kind == "stuck":
            st.status, st.block_op = STUCK, op
        elif op.kind == "crash":
            st.status, st.code, st.dump_at_exit, st.block_op = EXITED, op.code, op.dump, op
        elif op.kind == "coll":
            rec = op.recs[st.sub]
            pos = st.pos.get(op.group, 0)
            st.pos[op.group] = pos + 1
            rdv = self._coll_rdv(op.group, pos)
            rdv.arrivals[st.rank], rdv.recs[st.rank] = st.t, rec
            self._record(st, op.group, rec, "", op, rdv, True)
            if op.is_async or (nccl and rec.api not in CPU_SYNC):
                st.outstanding.append(rdv)
                st.t += 0.00002
                st.pc += 1
            else:
                st.status, st.blocked, st.block_op, st.block_rec = BLOCKED, [rdv], op, rec
        elif op.kind == "wait":
            if st.outstanding:
                st.status, st.blocked, st.block_op, st.outstanding = BLOCKED, st.outstanding, op, []
                st.block_rec = None
            else:
                st.pc += 1
        elif op.kind == "p2p":
            src, dst = (st.rank, op.peer) if op.send else (op.peer, st.rank)
            rdv = self._p2p_rdv(st, op.group, src, dst)
            rdv.arrivals[st.rank] = st.t
            g = layout.groups[op.group]
            if nccl:
                me, peer = g.local(st.rank), g.local(op.peer)
                name = f"send {me}->{peer}" if op.send else f"recv {me}<-{peer}"
                self._record(st, op.group, _p2p_rec(op), name, op, rdv, False)
                st.outstanding.append(rdv)  # NCCL: the CPU goes on; the step's sync point waits
                st.t += 0.00002
                st.pc += 1
                return
            self._log(st, op.group, self._bump(st.op_id, op.group), (rdv,))
            st.status, st.blocked, st.block_op, st.block_rec = BLOCKED, [rdv], op, None
        elif op.kind == "batch":
            rdvs: list[Rdv] = []
            for is_send, peer in op.posts:
                src, dst = (st.rank, peer) if is_send else (peer, st.rank)
                rdv = self._p2p_rdv(st, op.group, src, dst, rdvs)
                rdv.arrivals[st.rank] = st.t
                rdvs.append(rdv)
            if nccl:
                self._record(st, op.group, _p2p_rec(op), "coalesced", op, tuple(rdvs), False)
                st.outstanding.extend(rdvs)
                st.t += 0.00002
                st.pc += 1
                return
            else:
                for _ in rdvs:
                    self._log(st, op.group, self._bump(st.op_id, op.group), tuple(rdvs))
            st.status, st.blocked, st.block_op, st.block_rec = BLOCKED, rdvs, op, None
        elif op.kind == "mbarrier":
            g = layout.groups[op.group]
            pos = st.mpos.get(op.group, 0)
            st.mpos[op.group] = pos + 1
            rdv = self._rdv(("m", op.group, pos), frozenset(g.ranks))
            rdv.arrivals[st.rank] = st.t
            self._bump(st.coll_seq, op.group, 2)
            self._log(st, op.group, self._bump(st.op_id, op.group, 2 * (len(g.ranks) - 1) if g.local(st.rank) == 0
                                               else 2), (rdv,))
            st.status, st.blocked, st.block_op, st.block_rec = BLOCKED, [rdv], op, None
        else:
            raise ValueError(op.kind)

    def _run(self, st: RankState) -> bool:
        ops = self.p.ops[st.rank]
        moved = False
        while True:
            if st.status == BLOCKED:
                if any(r.done is None for r in st.blocked):
                    return moved
                st.t = max([st.t, *(r.done for r in st.blocked if r.done is not None)])
                st.blocked, st.status, st.block_op, st.block_rec = [], RUN, None, None
                op = ops[st.pc]
                if op.kind == "coll" and not op.is_async and st.sub + 1 < len(op.recs):
                    st.sub += 1
                else:
                    st.pc, st.sub = st.pc + 1, 0
                st.t += 0.00005
                moved = True
            if st.status != RUN:
                return moved
            if st.pc >= len(ops):
                st.status = DONE
                return True
            self._step(st, ops[st.pc])
            moved = True

    def _loop(self) -> None:
        while True:
            moved = False
            for st in self.states.values():
                moved = self._run(st) or moved
            moved = self._try_complete() or moved
            if not moved:
                break

    def _outlived(self) -> dict[int, float]:
        """NCCL: the ranks whose process ended (a crash) while an op they were in had not finished, with
        when: the first pass let such ops finish with the members that were left."""
        if self.p.backend != "nccl":
            return {}
        deaths = {r: st.t for r, st in self.states.items() if st.status == EXITED}
        late = any(x.done is not None and any(deaths.get(m, x.done) < x.done for m in x.expected) for x in self.rdvs)
        return deaths if late else {}

    def execute(self) -> Execution:
        self._loop()
        deaths = self._outlived()
        if deaths:
            # Again with the deaths known (the same jitter, no draw): a rank's own way to its crash only
            # waited on ops that finished before it, so it dies at the same moment.
            again = Executor(self.p, self.rng, deaths, self.jitter)
            again._loop()
            return again._finish()
        return self._finish()

    def _finish(self) -> Execution:
        end = max([st.t for st in self.states.values()] + [r.done for r in self.rdvs if r.done is not None])
        return Execution(self.p, self.states, self.rdvs, end, 1_796_000_000_000_000_000
                         + self.rng.randrange(10**15))


def _p2p_rec(op: Op) -> Rec:
    shapes = tuple(op.shape for _ in (op.posts or ((op.send, op.peer),)))
    dts = tuple(op.dtype for _ in shapes)
    return Rec("p2p", shapes, dts, shapes, dts, op.shape, op.dtype, "batch_isend_irecv" if op.posts else
               ("send" if op.send else "recv"))


def execute(program: Program, rng: random.Random) -> Execution:
    return Executor(program, rng).execute()
