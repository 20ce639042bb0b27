"""The node ledger's model (frscope.analysis.suspicion): which incidents weigh on a node, how much,
how that decays, and when a node is suspected or ready to fence."""

from __future__ import annotations

import pytest

from frscope.analysis.suspicion import (
    Assessment,
    EvidenceClass,
    IncidentInput,
    LedgerPolicy,
    NodeIncident,
    NodeState,
    RankEnd,
    assess,
    decayed,
    exit_evidence,
    implicate,
    remember,
    score,
)

HOUR = 3600.0
NOW = 1_800_000_000.0
POLICY = LedgerPolicy()


def incident(category: str, nodes: dict[str, tuple[int, ...]], *, job: str = "ml/a", at: float = NOW,
             ambiguous: bool = False, exits: dict[int, RankEnd] | None = None, key: str | None = None) -> IncidentInput:
    return IncidentInput(key=key or f"{job}-{category}-{at}", job=job, job_uid=f"uid-{job}", at=at,
                         category=category, ambiguous=ambiguous, nodes=nodes, exits=exits or {})


def on(node: str, inc: IncidentInput) -> NodeIncident:
    return implicate(inc)[node]


# -- evidence classes ------------------------------------------------------------------------------
@pytest.mark.parametrize("category", ["RankNotJoined", "CollectiveTypeMismatch", "SizeMismatch", "DtypeMismatch",
                                      "P2PMismatch"])
def test_code_faults_never_weigh_on_the_node(category: str) -> None:
    [item] = implicate(incident(category, {"n1": (1,)})).values()
    assert item.evidence is EvidenceClass.CODE and item.weight == 0


def test_a_mismatch_stays_a_code_fault_even_with_a_hardware_looking_end() -> None:
    inc = incident("SizeMismatch", {"n1": (1,)}, exits={1: RankEnd(exit_code=1, message="NVRM: Xid 79")})
    assert on("n1", inc).weight == 0


def test_a_collective_every_rank_entered_weighs_in_full_on_one_node_and_split_over_several() -> None:
    [one] = implicate(incident("NotCompleted", {"n1": (3,)})).values()
    assert (one.evidence, one.weight) == (EvidenceClass.STUCK_COLLECTIVE, 1.0)
    split = list(implicate(incident("NotCompleted", {"n1": (0, 1), "n2": (2, 3)})).values())
    assert [(i.evidence, i.weight) for i in split] == [(EvidenceClass.STUCK_COLLECTIVE, 0.5)] * 2
    assert "split over 2 nodes" in split[0].why


def test_a_straggler_weighs_half() -> None:
    [item] = implicate(incident("Straggler", {"n1": (2,)})).values()
    assert (item.evidence, item.weight) == (EvidenceClass.STRAGGLER, 0.5)


def test_an_ambiguous_verdict_or_missing_dumps_say_nothing_about_the_node() -> None:
    assert on("n1", incident("NotCompleted", {"n1": (1,)}, ambiguous=True)).evidence is EvidenceClass.UNCLEAR
    assert on("n1", incident("MissingDumps", {"n1": (1,)})).weight == 0


@pytest.mark.parametrize(("end", "cls"), [
    (RankEnd(exit_code=1, message="RuntimeError: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus"),
     EvidenceClass.HARDWARE_EXIT),
    (RankEnd(exit_code=134, message="CUDA error: uncorrectable ECC error encountered"), EvidenceClass.HARDWARE_EXIT),
    (RankEnd(exit_code=1, message="xid=48 double-bit"), EvidenceClass.HARDWARE_EXIT),
    (RankEnd(exit_code=137, pod_reason="Evicted",
             pod_message="The node was low on resource: memory. Threshold quantity: 100Mi"), EvidenceClass.NODE_OOM),
    (RankEnd(exit_code=137, reason="OOMKilled"), EvidenceClass.CODE),  # its own container limit
    (RankEnd(exit_code=1, message="Traceback ... ValueError: bad batch"), EvidenceClass.CODE),
    (RankEnd(exit_code=1, message="NVRM: Xid 31, MMU fault (an illegal address)"), EvidenceClass.CODE),
    (RankEnd(exit_code=139), EvidenceClass.UNCLEAR),  # SIGSEGV: could be either
])
def test_a_crash_weighs_on_the_node_only_with_a_hardware_looking_end(end: RankEnd, cls: EvidenceClass) -> None:
    item = on("n1", incident("RankStopped", {"n1": (1,)}, exits={1: end}))
    assert item.evidence is cls
    assert item.weight == {EvidenceClass.HARDWARE_EXIT: 1.0, EvidenceClass.NODE_OOM: 0.5}.get(cls, 0.0)


def test_a_crash_with_no_known_end_is_unclear() -> None:
    assert on("n1", incident("RankStopped", {"n1": (1,)})).evidence is EvidenceClass.UNCLEAR


def test_a_ranks_end_weighs_on_its_own_node_only() -> None:
    inc = incident("RankStopped", {"n1": (0,), "n2": (1,)},
                   exits={0: RankEnd(exit_code=1, message="ValueError"), 1: RankEnd(exit_code=1, message="Xid 94")})
    assert [(i.evidence, i.weight) for i in implicate(inc).values()] == [(EvidenceClass.CODE, 0.0),
                                                                (EvidenceClass.HARDWARE_EXIT, 1.0)]


def test_a_hostile_message_is_searched_in_bounded_time_and_only_its_head() -> None:
    huge = "x" * 10_000_000 + " Xid 79"
    assert exit_evidence(RankEnd(exit_code=1, message=huge)) == (EvidenceClass.CODE, "exited with code 1, an error "
                                                                 "of its own, no sign of hardware")


def test_an_incident_without_node_implicates_nothing() -> None:
    assert implicate(incident("NotCompleted", {"": (1,)})) == {}


# -- decay and memory ------------------------------------------------------------------------------
def test_weight_halves_every_half_life() -> None:
    assert decayed(1.0, NOW - 24 * HOUR, NOW, 24 * HOUR) == pytest.approx(0.5)
    assert decayed(1.0, NOW - 72 * HOUR, NOW, 24 * HOUR) == pytest.approx(0.125)
    assert decayed(1.0, NOW + HOUR, NOW, 24 * HOUR) == 1.0  # a clock ahead never adds weight


def test_remember_dedupes_by_incident_forgets_old_ones_and_keeps_the_newest() -> None:
    old = on("n1", incident("NotCompleted", {"n1": (1,)}, at=NOW - 8 * 24 * HOUR))
    first = on("n1", incident("NotCompleted", {"n1": (1,)}, key="k"))
    again = on("n1", incident("Straggler", {"n1": (1,)}, key="k"))
    kept = remember([old, first], [again], NOW, POLICY)
    assert kept == [first]
    many = [on("n1", incident("Straggler", {"n1": (1,)}, at=NOW - i)) for i in range(100)]
    kept = remember([], many, NOW, POLICY)
    assert len(kept) == POLICY.max_incidents and kept[-1].at == NOW and kept[0].at == NOW - 63


# -- suspicion and fencing -------------------------------------------------------------------------
def _ledger(*incs: IncidentInput) -> dict[str, list[NodeIncident]]:
    out: dict[str, list[NodeIncident]] = {}
    for inc in incs:
        for node, item in implicate(inc).items():
            out.setdefault(node, []).append(item)
    return out


def test_three_jobs_two_nodes_the_shared_node_is_suspected_code_faults_never_count() -> None:
    # Jobs a and b hang on the node they share (one rank never completes there); job c's rank never
    # joined (a code fault) on the other node and on the shared one.
    ledger = _ledger(
        incident("NotCompleted", {"shared": (1,)}, job="ml/a", at=NOW - 2 * HOUR),
        incident("NotCompleted", {"shared": (5,)}, job="ml/b", at=NOW - HOUR),
        incident("RankNotJoined", {"other": (0,)}, job="ml/c", at=NOW - HOUR),
        incident("RankNotJoined", {"shared": (3,)}, job="ml/c", at=NOW - 0.5 * HOUR, key="c2"),
    )
    shared = assess(ledger["shared"], NOW, POLICY)
    other = assess(ledger["other"], NOW, POLICY)
    assert shared.state is NodeState.SUSPECTED and shared.fence_ready, shared
    assert shared.jobs == 2 and shared.incidents == 2 and 1.9 < shared.score < 2.0
    assert other.state is NodeState.WATCHED and other.score == 0 and not other.fence_ready, other


def test_one_job_alone_never_makes_a_node_suspect() -> None:
    items = [on("n1", incident("NotCompleted", {"n1": (1,)}, job="ml/a", at=NOW - i * HOUR)) for i in range(5)]
    result = assess(items, NOW, POLICY)
    assert result.score > 4 and result.jobs == 1 and result.state is NodeState.WATCHED


def test_two_stragglers_of_two_jobs_are_not_enough_three_are() -> None:
    items = [on("n1", incident("Straggler", {"n1": (1,)}, job=f"ml/{j}")) for j in "ab"]
    assert assess(items, NOW, POLICY).state is NodeState.WATCHED
    items.append(on("n1", incident("Straggler", {"n1": (1,)}, job="ml/c")))
    assert assess(items, NOW, POLICY).state is NodeState.SUSPECTED


def test_old_incidents_decay_below_suspicion() -> None:
    items = [on("n1", incident("NotCompleted", {"n1": (1,)}, job=f"ml/{j}", at=NOW - 2 * 24 * HOUR)) for j in "ab"]
    result = assess(items, NOW, POLICY)
    assert result.score == pytest.approx(0.5) and result.state is NodeState.WATCHED


def test_fencing_needs_the_incidents_within_the_window() -> None:
    policy = LedgerPolicy(fence_window_s=HOUR, suspect_score=1.0)
    items = [on("n1", incident("NotCompleted", {"n1": (1,)}, job="ml/a", at=NOW - 3 * HOUR)),
             on("n1", incident("NotCompleted", {"n1": (1,)}, job="ml/b", at=NOW - 0.5 * HOUR))]
    result = assess(items, NOW, policy)
    assert result.state is NodeState.SUSPECTED and not result.fence_ready
    assert "1 weighing incident(s) of 1 job(s) in the last 1 h (2 of 2 needed)" in result.why


def test_a_person_released_node_is_not_fenced_again_without_new_incidents() -> None:
    items = [on("n1", incident("NotCompleted", {"n1": (1,)}, job=f"ml/{j}", at=NOW - HOUR)) for j in "ab"]
    released = NOW - 0.5 * HOUR
    result = assess(items, NOW, POLICY, released_at=released)
    assert result.state is NodeState.SUSPECTED and not result.fence_ready
    assert "since a person released it" in result.why
    items += [on("n1", incident("NotCompleted", {"n1": (1,)}, job=f"ml/{j}", at=NOW - 60)) for j in "cd"]
    assert assess(items, NOW, POLICY, released_at=released).fence_ready


def test_a_fenced_node_is_fenced_and_not_ready_again() -> None:
    items = [on("n1", incident("NotCompleted", {"n1": (1,)}, job=f"ml/{j}")) for j in "ab"]
    result = assess(items, NOW, POLICY, fenced=True)
    assert (result.state, result.fence_ready) == (NodeState.FENCED, False)


def test_scores_ignore_code_faults_and_unclear_incidents() -> None:
    categories = ("RankNotJoined", "MissingDumps", "SizeMismatch")
    items = [on("n1", incident(c, {"n1": (1,)}, job=f"ml/{c}")) for c in categories]
    assert score(items, NOW, POLICY) == 0
    result: Assessment = assess(items, NOW, POLICY)
    assert (result.incidents, result.jobs, result.last_incident) == (0, 0, NOW)


def test_the_policy_refuses_nonsense() -> None:
    for bad in ({"half_life_s": 0}, {"suspect_score": float("nan")}, {"fence_jobs": 0}, {"memory_s": -1}):
        with pytest.raises(ValueError):
            LedgerPolicy(**bad)
