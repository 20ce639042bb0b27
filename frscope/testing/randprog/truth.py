"""What is right for an execution, read from the executor's final state (never from the fault's name).

1. A mismatch: the first collective every member joined whose ops, shapes or dtypes disagree. Culprits
   are the ranks of the minority signature (a tie cannot be decided).
2. Else the wait-for graph: a blocked rank waits for the members of its rendezvous (and of the unfinished
   ones before it on that group's queue) that have not arrived. Its sinks (stuck in Python, exited) are
   the culprits. Where the sinks are ranks that finished their program (idle), the side with the odd count
   is: the few ranks blocked one collective beyond the others (an extra call) or the few that stopped short
   (an early exit). Without sinks the blocked ranks form a cycle: two ranks blocked in point-to-point ops
   on each other are a p2p mismatch; across groups, the ranks whose group order differs from the majority
   of the ranks in both groups are the culprits (a tie cannot be decided).
3. Else a straggler: a rank whose own compute is later than the median by a clear margin at most steps.
4. Else healthy (no finding).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from frscope.testing.randprog.executor import BLOCKED, DONE, EXITED, FAILED, STUCK, Execution, Rdv
from frscope.testing.randprog.layout import Layout

NOT_JOINED, STOPPED, MISSING = "RankNotJoined", "RankStopped", "MissingDumps"
TYPE, SIZE, DTYPE = "CollectiveTypeMismatch", "SizeMismatch", "DtypeMismatch"
P2P, STRAGGLER = "P2PMismatch", "Straggler"
FILE_FORMS = ("pickle", "json")
FEW_STEPS = 5


@dataclass(slots=True)
class Truth:
    category: str  # "healthy" or a frscope category
    culprits: tuple[int, ...]
    accepted: tuple[str, ...]
    why: str
    undecidable: dict[str, str] = field(default_factory=dict)  # form -> why the evidence cannot decide
    mismatch_at: Rdv | None = None  # the collective where the members disagreed
    # evidence flags the forms need
    via_unrecorded: bool = False  # the culprit shows only through ops gloo does not record
    lookalikes: tuple[int, ...] = ()  # blocked ranks the recorders show exactly like the culprits
    # a wait the evidence shows names the culprits: a recorded collective, NCCL's point-to-point ops, a live
    # stack in monitored_barrier (whose group the recorders show); where none does, only stacks could, and a
    # stack that shows only the user's frame (or a send/recv, which names no peer) names nobody
    named: bool = True

    def to_json(self) -> dict[str, object]:
        return {"category": self.category, "culprits": list(self.culprits), "accepted": list(self.accepted),
                "why": self.why, "undecidable": self.undecidable}


def _minority(sides: Mapping[Any, set[int]]) -> tuple[set[int], bool]:
    """The ranks of the smaller side(s) and whether that is decided (False on a tie)."""
    sizes = sorted(len(s) for s in sides.values())
    if len(sizes) < 2:
        return set().union(*sides.values()), False
    big = max(sides.values(), key=len)
    if sizes[-1] == sizes[-2]:
        return set().union(*sides.values()), False
    return set().union(*(s for s in sides.values() if s is not big)), True


def _mismatch(ex: Execution) -> Truth | None:
    bad = [r for r in ex.rdvs if r.key[0] == "c" and not r.missing and r.outcome in ("silent", "hang_type",
                                                                                       "hang_size", "abort")]
    if not bad:
        return None
    rdv = min(bad, key=lambda r: max(r.arrivals.values()))
    recs = rdv.recs
    if rdv.outcome == "hang_type":
        sides: dict[object, set[int]] = {}
        for rank, rec in recs.items():
            sides.setdefault(rec.op, set()).add(rank)
        category, accepted = TYPE, [TYPE]
        culprits, decided = _minority(sides)
        if decided and _shifted(ex, rdv, culprits):
            accepted.append(NOT_JOINED)  # a skipped or extra call: its next call meets the others' previous one
    else:
        shapes = {rec.payload for rec in recs.values()}
        category = SIZE if len(shapes) > 1 else DTYPE
        sides = {}
        for rank, rec in recs.items():
            sides.setdefault(rec.payload if category == SIZE else rec.dtype, set()).add(rank)
        culprits, decided = _minority(sides)
        accepted = [category]
        if category == SIZE and _minority(_sides(recs, "dtype")) == (culprits, True):
            # the same ranks passed other dtypes too: a dtype finding names the same odd side (and it is what
            # the recorder shows where the op's sizes may differ by design: all_to_all)
            accepted.append(DTYPE)
    g = ex.program.layout.groups[rdv.group]
    why = (f"{rdv.outcome} at group {g.name} position {rdv.key[2] + 1}: "
           + ", ".join(f"{sorted(s)}={k}" for k, s in sides.items()))
    truth = Truth(category, tuple(sorted(culprits)), tuple(accepted), why, mismatch_at=rdv)
    if not decided:
        truth.undecidable = {f: "the ranks split evenly: nothing says which side is odd" for f in
                             ("snapshot", *FILE_FORMS)}
    if len({(rec.in_sizes, rec.out_sizes, rec.in_dtypes, rec.out_dtypes) for rec in recs.values()}) == 1:
        # the shapes differ but what the recorder keeps does not (the same bytes through an op gloo records
        # as another, on the flattened tensor): no dump can show it
        truth.undecidable = {f: "every rank's recorder keeps the same sizes and dtypes for this op" for f in
                             ("snapshot", *FILE_FORMS)}
    if rdv.outcome == "abort":
        truth.undecidable = {f: "gloo aborted every member at once; the common side left no dump" for f in
                             ("snapshot", *FILE_FORMS)}
    return truth


def _sides(recs: Mapping[int, Any], attr: str) -> dict[object, set[int]]:
    sides: dict[object, set[int]] = {}
    for rank, rec in recs.items():
        sides.setdefault(getattr(rec, attr), set()).add(rank)
    return sides


def _shifted(ex: Execution, rdv: Rdv, culprits: set[int]) -> bool:
    pos = int(rdv.key[2])
    for other in (pos - 1, pos + 1):
        near = next((r for r in ex.rdvs if r.key == ("c", rdv.group, other)), None)
        if near is None:
            continue
        mine = {rdv.recs[c].op for c in culprits}
        theirs = {rec.op for rank, rec in near.recs.items() if rank not in culprits}
        if mine & theirs:
            return True
    return False


def waits_on(rdv: Rdv) -> set[int]:
    out: set[int] = set(rdv.missing) | rdv.dead  # (NCCL: a member whose process ended in it)
    for dep in rdv.after:  # NCCL p2p held behind an earlier op on a member's stream
        if dep.done is None:
            out |= (dep.missing or set(dep.expected)) - set(rdv.missing)
    prev = rdv.prev
    while prev is not None and prev.done is None:
        out |= prev.missing | prev.dead
        prev = prev.prev
    return out


def _reach(edges: dict[int, set[int]], start: Iterable[int]) -> set[int]:
    seen, todo = set(), list(start)
    while todo:
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        todo.extend(edges.get(r, ()))
    return seen


def _recorded(rdv: Rdv, backend: str) -> bool:
    return rdv.key[0] == "c" or (backend == "nccl" and rdv.key[0] == "p")


def _wait_for(ex: Execution) -> Truth | None:
    states = ex.states
    # a rank that failed because a peer died waited for that peer: it is an edge, not a sink
    blocked = {r: st for r, st in states.items() if st.status in (BLOCKED, FAILED)}
    if not blocked:
        sinks = [r for r, st in states.items() if st.status in (STUCK, EXITED)]
        if not sinks:
            return None
        in_python = [r for r in sinks if states[r].status == STUCK]
        truth = Truth(NOT_JOINED if in_python else STOPPED, tuple(sorted(sinks)),
                      (NOT_JOINED,) if in_python else (NOT_JOINED, STOPPED, MISSING), "stopped with nobody waiting")
        if in_python:
            truth.undecidable = {f: "nobody waits for the rank stuck in Python: every recorder is complete" for f in
                                 ("snapshot", *FILE_FORMS)}
        return truth
    # a p2p op whose named peer never posts the counterpart (in what it has left to run): that rank named
    # the wrong peer (a rank stuck before its send, or a deadlock, still posts it later)
    peer_of: dict[int, int] = {}
    for r, st in blocked.items():
        for x in st.blocked:
            if st.status == BLOCKED and x.key[0] == "p" and not _matchable(ex, r, x):
                peer_of.setdefault(r, next(iter(x.expected - {r})))
    # a sender whose receiver is itself busy with another peer is the victim of that receiver's choice
    wrong = sorted(r for r, q in peer_of.items() if not (q in peer_of and peer_of[q] != r)) or sorted(peer_of)
    if wrong:
        return Truth(P2P, tuple(wrong), (P2P,), f"p2p naming a peer that never posts the counterpart: {wrong}",
                     via_unrecorded=ex.program.backend == "gloo", named=ex.program.backend != "gloo")
    edges = {r: set().union(*(waits_on(x) for x in st.blocked)) for r, st in blocked.items()}
    reach = _reach(edges, blocked)
    hard = sorted(r for r in reach if states[r].status in (STUCK, EXITED))
    backend = ex.program.backend
    if hard:
        stuck = all(states[r].status == STUCK for r in hard)
        accepted: tuple[str, ...] = (NOT_JOINED,) if stuck else (NOT_JOINED, STOPPED, MISSING)
        if any(x.key[0] == "p" and set(hard) & x.missing for st in blocked.values() for x in st.blocked):
            accepted += (P2P,)  # a peer waits for the sink in send/recv: a p2p op it never posted
        visible = any(_recorded(x, backend) and set(hard) & waits_on(x) for st in blocked.values() for x in st.blocked)
        # (an async collective a blocked rank still has open shows in its recorder too: it names the ranks that
        # never entered it)
        pending = any(x.key[0] == "c" and x.done is None and set(hard) & x.missing
                      for st in blocked.values() for x in st.outstanding)
        # a rank in monitored_barrier names the members of its group that never came (a live stack shows the
        # barrier, the gaps in the group's sequence numbers its group)
        by_barrier = any(x.key[0] == "m" and set(hard) & waits_on(x) for st in blocked.values() for x in st.blocked)
        # ranks the recorded waits also name, blocked only in ops the recorder does not keep: from the
        # recorders they look exactly like the culprit (idle since their last entry)
        named = set().union(*(waits_on(x) for st in blocked.values() for x in st.blocked if _recorded(x, backend)))
        lookalikes = {r for r in named - set(hard) if r in blocked
                      and not any(_recorded(x, backend) for x in blocked[r].blocked)}
        truth = Truth(NOT_JOINED if stuck else STOPPED, tuple(hard), accepted,
                      "sink " + ", ".join(f"{r} {states[r].status}" for r in hard),
                      via_unrecorded=not visible or bool(lookalikes), lookalikes=tuple(sorted(lookalikes)),
                      named=visible or pending or by_barrier)
        return truth
    idle = sorted(r for r in reach if states[r].status == DONE)
    if idle:
        # the side with the odd count: blocked one call beyond the others, or stopped short of them
        for st in blocked.values():
            for x in st.blocked:
                gone = waits_on(x) & set(idle)
                if gone:
                    arrived = set(x.arrivals)
                    odd, decided = _minority({"blocked": arrived, "idle": gone})
                    truth = Truth(NOT_JOINED, tuple(sorted(odd)), (NOT_JOINED,),
                                  f"blocked {sorted(arrived)} vs finished {sorted(gone)} at {x.key}",
                                  via_unrecorded=not _recorded(x, backend), named=_recorded(x, backend))
                    if not decided:
                        truth.undecidable = {f: "as many ranks ran one call more as one call fewer" for f in
                                             ("snapshot", *FILE_FORMS)}
                    return truth
    # a cycle among blocked ranks
    cyc = sorted(r for r in blocked if r in _reach(edges, edges[r]))
    # a p2p cycle: the waits that close it are point-to-point (NCCL ranks wait at a sync point for
    # collectives too, which are not what holds them)
    if cyc and all(all(x.key[0] == "p" for x in blocked[r].blocked if waits_on(x) & set(cyc)) for r in cyc):
        return Truth(P2P, tuple(cyc), (P2P,), f"p2p cycle {cyc}", via_unrecorded=backend == "gloo",
                     named=backend != "gloo")
    # every blocked rank that waits on the cycle, by where it waits: a collective of a group, or a p2p
    # message (comparable only between its two ranks)
    near = sorted(r for r in blocked if set(cyc) & _reach(edges, [r]))
    # where each waits: the first of its rendezvous not done (a wait on several async ops lists the done
    # ones too: a rank is not where it already went past)
    slot = {r: _slot(next((x for x in blocked[r].blocked if x.done is None), blocked[r].blocked[0])) for r in near}
    slots = sorted(set(slot.values()), key=str)
    layout = ex.program.layout
    found: set[int] = set()
    decided = True
    for i, sa in enumerate(slots):
        for sb in slots[i + 1:]:
            both = set(_members(sa, layout)) & set(_members(sb, layout)) & set(near)
            sides = {sa: {r for r in both if slot[r] == sa}, sb: {r for r in both if slot[r] == sb}}
            if not sides[sa] or not sides[sb]:
                continue
            few, ok = _minority(sides)
            found |= few
            decided = decided and ok
    groups = sorted({x.group for r in cyc for x in blocked[r].blocked})
    if not found:
        found, decided = set(cyc), False
    odd_op = (TYPE,) if decided and _odd_op_where_waiting(blocked, found) else ()
    seen = any(_recorded(x, backend) for r in cyc for x in blocked[r].blocked)
    truth = Truth(NOT_JOINED, tuple(sorted(found)), (NOT_JOINED, *odd_op), f"cycle over groups {groups} among {cyc}",
                  via_unrecorded=not seen, named=seen)
    if not decided:
        truth.undecidable = {f: "the cycle's two orders have as many ranks each" for f in ("snapshot", *FILE_FORMS)}
    return truth


def _odd_op_where_waiting(blocked: Mapping[int, Any], culprits: set[int]) -> bool:
    """The culprits wait in a collective whose arrived ranks called different ops, the culprits alone the
    odd ones there (an extra or skipped call meets the others' next one): the recorders show a type mismatch
    among the ranks that joined it, which names the same ranks."""
    for rank in culprits:
        for rdv in blocked[rank].blocked:
            if rdv.key[0] != "c" or len({rec.op for rec in rdv.recs.values()}) < 2:
                continue
            odd, decided = _minority(_sides(rdv.recs, "op"))
            if decided and rank in odd and odd <= culprits:
                return True
    return False


def _matchable(ex: Execution, rank: int, rdv: Rdv) -> bool:
    """Whether the peer of `rank`'s p2p rendezvous still has the counterpart op in its program."""
    src, dst = int(rdv.key[2]), int(rdv.key[3])
    peer, peer_sends = (dst, False) if rank == src else (src, True)
    st = ex.states[peer]
    for op in ex.program.ops[peer][st.pc:]:
        if op.group != rdv.group:
            continue
        if op.kind == "p2p" and op.peer == rank and op.send == peer_sends:
            return True
        if op.kind == "batch" and (peer_sends, rank) in op.posts:
            return True
    return any(x is rdv for x in st.blocked) or rank in rdv.arrivals and peer in rdv.arrivals


def _slot(rdv: Rdv) -> tuple[object, ...]:
    return ("c", rdv.group) if rdv.key[0] == "c" else (rdv.key[0], rdv.group, *sorted(rdv.expected))


def _members(slot: tuple[object, ...], layout: Layout) -> tuple[int, ...]:
    if slot[0] == "p":
        return tuple(int(str(r)) for r in slot[2:])
    return layout.groups[int(str(slot[1]))].ranks


def _stragglers(ex: Execution) -> Truth | None:
    """Ranks whose own compute is late (beyond the median, or the other rank's in a 2-rank job) by a clear
    margin at most steps. Under FEW_STEPS steps the evidence is too thin to decide either way."""
    steps, world = ex.program.steps, ex.program.layout.world
    late: dict[int, int] = {}
    for step in range(1, steps + 1):
        comp = {r: _compute(ex, r, step) for r in ex.states}
        ref = min(comp.values()) if world == 2 else statistics.median(comp.values())
        for r, c in comp.items():
            if c - ref > max(0.02, 0.25 * ref):
                late[r] = late.get(r, 0) + 1
    slow = sorted(r for r, n in late.items() if n >= 0.6 * steps)
    if not slow or (world > 2 and len(slow) * 2 >= world):
        return None
    truth = Truth(STRAGGLER, tuple(slow), (STRAGGLER,), f"compute late at most steps: {slow}")
    hidden = [r for r in slow if len(late_recorded_steps(ex, r, set(slow))) < 0.6 * steps]
    if hidden:
        truth.undecidable = {f: f"rank(s) {hidden} arrive late only at ops the recorder does not keep (gloo's "
                                "point-to-point ops, monitored_barrier), at point-to-point messages (NCCL records "
                                "them, but a receiver waiting for its sender is also a healthy pipeline's shape), "
                                "or together with ranks that waited for them there: no recorded collective shows "
                                "them alone late"
                             for f in ("snapshot", *FILE_FORMS)}
    elif lookalikes := _unrecorded_lookalikes(ex, set(slow)):
        truth.undecidable = {f: f"rank(s) {lookalikes} waited for the straggler in ops the recorder does not keep "
                                "(gloo's point-to-point ops, monitored_barrier) and reach recorded collectives as "
                                "late as it does, each in its own: nothing recorded tells them apart"
                             for f in ("snapshot", *FILE_FORMS)}
    elif steps < FEW_STEPS:
        truth.undecidable = {f: f"late at each of only {steps} steps: too few to tell from jitter"
                             for f in ("snapshot", *FILE_FORMS)}
    return truth


def _unrecorded_lookalikes(ex: Execution, culprits: set[int]) -> list[int]:
    """Ranks that waited in an unrecorded op (gloo's send/recv, monitored_barrier) and, at recorded
    collectives, come clearly after every other rank that is not a culprit at most steps: in the records
    they are stragglers as much as the culprits."""
    if ex.program.backend != "gloo":
        return []
    waited = {r for rdv in ex.rdvs if rdv.key[0] != "c" and rdv.done is not None
              for r, t in rdv.arrivals.items() if r not in culprits and rdv.done - t > 0.02}
    steps = ex.program.steps
    return sorted(r for r in waited if len(late_recorded_steps(ex, r, culprits | {r})) >= 0.6 * steps)


def late_recorded_steps(ex: Execution, rank: int, culprits: set[int],
                        kept: Callable[[Rdv], bool] | None = None) -> set[int]:
    return set(late_recorded(ex, rank, culprits, kept))


def late_recorded(ex: Execution, rank: int, culprits: set[int],
                  kept: Callable[[Rdv], bool] | None = None) -> dict[int, int]:
    """Steps where `rank` reached a recorded collective of that step clearly after every participant that
    is not a culprit (a rank that waited for it in an unrecorded op, gloo's send/recv, arrives as late:
    that collective cannot tell them apart). `kept`: only the collectives every participant's recorder
    still holds (a ring buffer that wrapped keeps the last few). Point-to-point messages never count, NCCL's
    recorded ones included: a sender later than its receiver at every message is a slow rank or a pipeline
    stage whose next stage waits for its output by design (a stage's work differs from its peers'); only
    a collective, where every member does the same work before it, shows lateness that is the rank's own.
    Per such step: the most ranks of a collective where it shows."""
    steps: dict[int, int] = {}
    for e in ex.states[rank].issued:
        rdv = e.rdv
        if isinstance(rdv, tuple) or len(rdv.arrivals) < 2 or e.p2p_name:
            continue
        if kept is not None and not kept(rdv):
            continue
        others = [t for r, t in rdv.arrivals.items() if r not in culprits]
        if others and rdv.arrivals.get(rank, 0.0) - max(others) > 0.02:
            steps[e.op.step] = max(steps.get(e.op.step, 0), len(rdv.arrivals))
    return steps


def _compute(ex: Execution, rank: int, step: int) -> float:
    return sum(op.seconds for op in ex.program.ops[rank] if op.kind == "compute" and op.step == step)


def truth_of(ex: Execution) -> Truth:
    found = _mismatch(ex) or _wait_for(ex) or _stragglers(ex)
    return found or Truth("healthy", (), (), "every rank finished its program")
