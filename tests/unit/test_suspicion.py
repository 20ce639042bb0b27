"""The node ledger's model (frscope.analysis.suspicion): which incidents weigh on a node, how much,
how that decays, and when a node is suspected or ready to fence: by namespaces (tenants), not jobs, and
with hardware evidence only from what the node itself says (NodeSignal), never a container's text."""

from __future__ import annotations

import pytest

from frscope.analysis.suspicion import (
    Assessment,
    EvidenceClass,
    IncidentInput,
    LedgerPolicy,
    NodeIncident,
    NodeSignal,
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


XID = NodeSignal(EvidenceClass.HARDWARE_EXIT, "the node's condition GpuXidError=True (Xid79: fallen off the bus)")
SYSTEM_OOM = NodeSignal(EvidenceClass.NODE_OOM, "the kubelet reported SystemOOM on the node")


def incident(category: str, nodes: dict[str, tuple[int, ...]], *, job: str = "ml/a", at: float = NOW,
             ambiguous: bool = False, exits: dict[int, RankEnd] | None = None, key: str | None = None,
             signals: dict[str, NodeSignal] | None = None) -> IncidentInput:
    """`job` is namespace/name; the incident's key (its report) is in the job's namespace."""
    return IncidentInput(key=key or f"{job}-{category}-{at}", job=job, job_uid=f"uid-{job}", at=at,
                         category=category, ambiguous=ambiguous, nodes=nodes, exits=exits or {},
                         node_signals=signals or {})


def on(node: str, inc: IncidentInput) -> NodeIncident:
    return implicate(inc)[node]


# -- evidence classes ------------------------------------------------------------------------------
@pytest.mark.parametrize("category", ["RankNotJoined", "CollectiveTypeMismatch", "SizeMismatch", "DtypeMismatch",
                                      "P2PMismatch"])
def test_code_faults_never_weigh_on_the_node(category: str) -> None:
    [item] = implicate(incident(category, {"n1": (1,)})).values()
    assert item.evidence is EvidenceClass.CODE and item.weight == 0


def test_a_mismatch_stays_a_code_fault_even_on_a_node_that_reports_hardware_trouble() -> None:
    inc = incident("SizeMismatch", {"n1": (1,)}, signals={"n1": XID})
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
     EvidenceClass.CODE),
    (RankEnd(exit_code=134, message="CUDA error: uncorrectable ECC error encountered"), EvidenceClass.UNCLEAR),
    (RankEnd(exit_code=137, reason="OOMKilled", message="The node was low on resource: memory. system OOM"),
     EvidenceClass.CODE),
    (RankEnd(exit_code=1, message="Traceback ... ValueError: bad batch"), EvidenceClass.CODE),
    (RankEnd(exit_code=139), EvidenceClass.UNCLEAR),  # SIGSEGV: could be either
])
def test_what_a_container_wrote_never_weighs_on_the_node(end: RankEnd, cls: EvidenceClass) -> None:
    """A termination message is the tenant's text: "Xid 79 ... fallen off the bus" in it is no evidence."""
    item = on("n1", incident("RankStopped", {"n1": (1,)}, exits={1: end}))
    assert (item.evidence, item.weight) == (cls, 0.0)
    assert exit_evidence(end) is not None and exit_evidence(end)[0] is cls  # type: ignore[index]


@pytest.mark.parametrize(("signal", "weight"), [(XID, 1.0), (SYSTEM_OOM, 0.5)])
def test_what_the_node_itself_reports_weighs_on_it(signal: NodeSignal, weight: float) -> None:
    item = on("n1", incident("RankStopped", {"n1": (1,)}, exits={1: RankEnd(exit_code=1)}, signals={"n1": signal}))
    assert (item.evidence, item.weight) == (signal.evidence, weight) and signal.why in item.why


def test_a_node_signal_is_only_hardware_or_node_oom() -> None:
    with pytest.raises(ValueError):
        NodeSignal(EvidenceClass.STUCK_COLLECTIVE, "a tenant's word")


def test_a_crash_with_no_known_end_is_unclear() -> None:
    assert on("n1", incident("RankStopped", {"n1": (1,)})).evidence is EvidenceClass.UNCLEAR


def test_a_nodes_signal_weighs_on_that_node_only() -> None:
    inc = incident("RankStopped", {"n1": (0,), "n2": (1,)}, exits={0: RankEnd(exit_code=1), 1: RankEnd(exit_code=1)},
                   signals={"n2": XID})
    assert [(i.evidence, i.weight) for i in implicate(inc).values()] == [(EvidenceClass.CODE, 0.0),
                                                                (EvidenceClass.HARDWARE_EXIT, 1.0)]


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


def test_two_tenants_and_the_nodes_own_signal_suspect_the_shared_node_code_faults_never_count() -> None:
    # Tenant ml's job hangs on the node; tenant cv's rank crashes there while the node reports an Xid
    # condition; job c's rank never joined (a code fault) on the other node and on the shared one.
    ledger = _ledger(
        incident("NotCompleted", {"shared": (1,)}, job="ml/a", at=NOW - 2 * HOUR),
        incident("RankStopped", {"shared": (5,)}, job="cv/b", at=NOW - HOUR, signals={"shared": XID}),
        incident("RankNotJoined", {"other": (0,)}, job="ml/c", at=NOW - HOUR),
        incident("RankNotJoined", {"shared": (3,)}, job="ml/c", at=NOW - 0.5 * HOUR, key="ml/c2"),
    )
    shared = assess(ledger["shared"], NOW, POLICY)
    other = assess(ledger["other"], NOW, POLICY)
    assert shared.state is NodeState.SUSPECTED and shared.fence_ready, shared
    assert (shared.jobs, shared.namespaces, shared.node_sourced, shared.incidents) == (2, 2, 1, 2)
    assert 1.9 < shared.score < 2.0
    assert other.state is NodeState.WATCHED and other.score == 0 and not other.fence_ready, other


def test_one_tenant_never_makes_a_node_suspect_however_many_jobs_and_whatever_the_node_says() -> None:
    """The hostile tenant: its jobs hang on the shared node, and the node even reports a problem."""
    items = [on("n1", incident("NotCompleted", {"n1": (1,)}, job=f"evil/j{i}", at=NOW - i * HOUR,
                               signals={"n1": XID} if i % 2 else None)) for i in range(6)]
    result = assess(items, NOW, POLICY)
    assert result.score > 5 and result.jobs == 6 and result.namespaces == 1 and result.state is NodeState.WATCHED
    assert not result.fence_ready and "evidence from 1 namespace(s) (2 needed)" in result.why


def test_two_tenants_without_the_nodes_own_signal_only_watch_the_node() -> None:
    items = [on("n1", incident("NotCompleted", {"n1": (1,)}, job=f"{ns}/a")) for ns in ("ml", "cv", "nlp")]
    result = assess(items, NOW, POLICY)
    assert result.namespaces == 3 and result.node_sourced == 0 and result.state is NodeState.WATCHED
    assert "0 backed by the node's own signals (1 needed)" in result.why
    assert assess(items, NOW, LedgerPolicy(need_node_evidence=False)).state is NodeState.SUSPECTED


def test_two_stragglers_of_two_tenants_are_not_enough_with_the_kubelets_oom_they_are() -> None:
    items = [on("n1", incident("Straggler", {"n1": (1,)}, job=f"{j}/a")) for j in "ab"]
    assert assess(items, NOW, POLICY).state is NodeState.WATCHED  # 1.0, and nothing from the node
    items.append(on("n1", incident("RankStopped", {"n1": (1,)}, job="a/b", signals={"n1": SYSTEM_OOM})))
    assert assess(items, NOW, POLICY).state is NodeState.SUSPECTED  # 1.5, and the kubelet's word


def test_old_incidents_decay_below_suspicion() -> None:
    items = [on("n1", incident("RankStopped", {"n1": (1,)}, job=f"{j}/a", at=NOW - 2 * 24 * HOUR,
                               signals={"n1": XID})) for j in "ab"]
    result = assess(items, NOW, POLICY)
    assert result.score == pytest.approx(0.5) and result.state is NodeState.WATCHED


def _bad_node(tenant: str, at: float = NOW) -> NodeIncident:
    return on("n1", incident("RankStopped", {"n1": (1,)}, job=f"{tenant}/a", at=at, signals={"n1": XID}))


def test_fencing_needs_the_incidents_within_the_window() -> None:
    policy = LedgerPolicy(fence_window_s=HOUR, suspect_score=1.0)
    items = [_bad_node("ml", NOW - 3 * HOUR), _bad_node("cv", NOW - 0.5 * HOUR)]
    result = assess(items, NOW, policy)
    assert result.state is NodeState.SUSPECTED and not result.fence_ready
    assert "1 weighing incident(s) of 1 namespace(s) in the last 1 h (2 of 2 needed" in result.why


def test_a_person_released_node_is_not_fenced_again_without_new_incidents() -> None:
    items = [_bad_node(j, NOW - HOUR) for j in "ab"]
    released = NOW - 0.5 * HOUR
    result = assess(items, NOW, POLICY, released_at=released)
    assert result.state is NodeState.SUSPECTED and not result.fence_ready
    assert "since a person released it" in result.why
    items += [_bad_node(j, NOW - 60) for j in "cd"]
    assert assess(items, NOW, POLICY, released_at=released).fence_ready


def test_a_fenced_node_is_fenced_and_not_ready_again() -> None:
    result = assess([_bad_node(j) for j in "ab"], NOW, POLICY, fenced=True)
    assert (result.state, result.fence_ready) == (NodeState.FENCED, False)


def test_scores_ignore_code_faults_and_unclear_incidents() -> None:
    categories = ("RankNotJoined", "MissingDumps", "SizeMismatch")
    items = [on("n1", incident(c, {"n1": (1,)}, job=f"ml/{c}")) for c in categories]
    assert score(items, NOW, POLICY) == 0
    result: Assessment = assess(items, NOW, POLICY)
    assert (result.incidents, result.jobs, result.namespaces, result.last_incident) == (0, 0, 0, NOW)


def test_the_policy_refuses_nonsense() -> None:
    for bad in ({"half_life_s": 0}, {"suspect_score": float("nan")}, {"fence_namespaces": 0}, {"memory_s": -1}):
        with pytest.raises(ValueError):
            LedgerPolicy(**bad)  # type: ignore[arg-type]
