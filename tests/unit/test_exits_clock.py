"""RankExit parsing, and where an age comes from when dump files were copied (fresh mtimes)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.records import RankExit, exits_from_json, load_dumps
from frscope.report import report_to_dict
from tests.unit import builders as b

REAL = Path(__file__).parent.parent / "data" / "real"


def test_exits_from_json_accepts_codes_and_objects() -> None:
    exits = exits_from_json({"2": -9, "3": {"exit_code": 137, "reason": "OOMKilled", "restart_count": 1}}, "f.json")
    assert exits[0] == RankExit(2, exit_code=-9, source="f.json")
    assert exits[0].failed and "SIGKILL" in exits[0].describe()
    assert exits[1].reason == "OOMKilled" and exits[1].restart_count == 1
    assert not RankExit(0, exit_code=0).failed
    with pytest.raises(ValueError, match="not a rank"):
        exits_from_json({"x": 1}, "f.json")


def _copy(tmp_path: Path, name: str, shift_s: float | None) -> Path:
    target = tmp_path / name
    shutil.copytree(REAL / name, target)  # copy2 keeps the mtimes, like `cp -p`
    if shift_s is not None:
        later = time.time() + shift_s
        for path in target.iterdir():
            os.utime(path, (later, later))  # what a plain `cp` or `kubectl cp` does
    return target


def test_copied_dumps_do_not_read_as_a_14_hour_hang(tmp_path: Path) -> None:
    copied = _copy(tmp_path, "hang-pickle", 14 * 3600)
    [finding] = analyze(load_dumps([copied]), AnalysisOptions(stall_after_s=1.0)).findings
    assert finding.category is Category.RANK_NOT_JOINED and finding.culprit_ranks == (1,)
    # The capture time is lost with the copy: no age is claimed, and both readings are given.
    assert finding.stalled_for_s is None
    assert finding.age_source is not None and finding.age_source.startswith("unknown: ")
    assert "copy" in finding.age_source and "timeout (30 min)" in finding.age_source
    assert "14 h" not in finding.summary and "for how long is unknown" in finding.summary
    assert report_to_dict(analyze(load_dumps([copied]), AnalysisOptions(stall_after_s=1.0)))["findings"][0][
        "age_source"] == finding.age_source


def test_preserved_mtimes_and_snapshots_say_where_the_age_came_from(tmp_path: Path) -> None:
    kept = _copy(tmp_path, "hang-pickle", None)
    # As if written 20 s after the newest entry (a checkout gives them the checkout's time instead).
    newest = max(e.time_created_ns or 0 for d in load_dumps([kept]).dumps.values() for e in d.entries)
    for path in kept.iterdir():
        os.utime(path, ns=(newest + 20 * 10**9, newest + 20 * 10**9))
    [finding] = analyze(load_dumps([kept]), AnalysisOptions(stall_after_s=1.0)).findings
    assert finding.age_source == "the dump files' modification time"
    assert finding.stalled_for_s is not None and 20 <= finding.stalled_for_s < 25
    [live] = analyze(load_dumps([REAL / "hang"]), AnalysisOptions(stall_after_s=1.0)).findings
    assert live.age_source == "the capture time the collector recorded"


def test_recorders_read_one_after_another_in_a_running_job_are_not_stale(tmp_path: Path) -> None:
    """A live gather reads ranks a few ms apart: one rank's recorder lags the others by collectives
    they finished meanwhile. That is not a stale dump (unless the runner says the rank failed)."""
    per_rank = {r: [b.entry(s, created_ns=b.T0 + s * 1_000_000) for s in range(1, 21)] for r in range(4)}
    per_rank[2] = per_rank[2][:16]  # read 4 collectives (4 ms) earlier than the others
    dumpset = load_dumps([b.job(tmp_path, per_rank, 4)])
    live = AnalysisOptions(stall_after_s=1.0, now_ns=b.T0 + 21 * 1_000_000)  # read just after the last entry
    assert analyze(dumpset, live).findings == []
    [finding] = analyze(dumpset, live, exits={2: RankExit(2, exit_code=137)}).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (2,)
    assert finding.exits[2].exit_code == 137 and "SIGKILL" in finding.summary


def test_a_dump_much_older_than_the_others_is_stale(tmp_path: Path) -> None:
    minute = 60 * 10**9
    per_rank = {r: [b.entry(s, created_ns=b.T0 + s * minute) for s in range(1, 21)] for r in range(4)}
    per_rank[1] = per_rank[1][:5]  # its last dump is from 15 minutes before the others'
    for r in (0, 2, 3):  # who now wait for it in #21
        per_rank[r].append(b.entry(21, state="scheduled", created_ns=b.T0 + 21 * minute))
    report = analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), AnalysisOptions(stall_after_s=10.0))
    [finding] = report.findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (1,)
    assert finding.stale_by_s == 16 * 60 and finding.collective_seq_id == 6  # behind the others' newest, #21
    assert "#5 of group 0 (default_pg)" in finding.summary and "#6-#20" in finding.summary


def test_an_older_read_is_no_finding_when_nobody_waits_on_nccl(tmp_path: Path) -> None:
    # NCCL's 'completed' means the op succeeded: every rank finished all it recorded, so the rank whose read
    # is older than the others' went on with them (a rank that died leaves the others blocked in their next
    # collective). On gloo, which retires a failed collective as finished, the same dumps stay suspect.
    minute = 60 * 10**9
    for backend, expected in (("nccl", []), ("gloo", [Category.RANK_STOPPED])):
        per_rank = {r: [b.entry(s, backend=backend, created_ns=b.T0 + s * minute) for s in range(1, 21)]
                    for r in range(4)}
        per_rank[1] = per_rank[1][:5]
        (tmp_path / backend).mkdir()
        report = analyze(load_dumps([b.job(tmp_path / backend, per_rank, 4)]), AnalysisOptions(stall_after_s=10.0))
        assert [f.category for f in report.findings] == expected, backend


def test_a_stopped_rank_is_the_one_root_across_its_groups(tmp_path: Path) -> None:
    minute = 60 * 10**9
    sub = ("1", "tp")
    per_rank: dict[int, list[dict[str, object]]] = {}
    for r in range(4):
        entries: list[dict[str, object]] = []
        for s in range(1, 21):
            entries.append(b.entry(s, created_ns=b.T0 + s * minute, record_id=len(entries)))
            if r in (0, 1):
                entries.append(b.entry(s, pg=sub, created_ns=b.T0 + s * minute + 1, record_id=len(entries)))
        per_rank[r] = entries
    per_rank[1] = per_rank[1][:10]  # rank 1's dump is from step 5; rank 0 then waits for it in tp #21
    per_rank[0].append(b.entry(21, pg=sub, state="scheduled", created_ns=b.T0 + 21 * minute, record_id=99))
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              "1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}
    for rank, entries in per_rank.items():
        b.write_pickle(tmp_path, rank, b.dump(entries, world=4, pg_config=config))
    dumpset = load_dumps([tmp_path])
    report = analyze(dumpset, AnalysisOptions(now_ns=b.T0 + 22 * minute))
    [root] = report.findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (1,)
    # Rank 0 waiting in tp #21 is not "NotCompleted": it waits for the rank that stopped.
    assert all(c.category is not Category.NOT_COMPLETED for c in root.consequences)


def test_a_death_before_the_hang_is_dated_against_it(tmp_path: Path) -> None:
    per_rank = {r: [b.entry(s) for s in range(1, 6)] + [b.entry(6, state="started")] for r in (0, 1, 3)}
    dumpset = load_dumps([b.job(tmp_path, per_rank, 4)])  # rank 2 left no dump
    entered = b.T0 + 6 * 1_000_000
    died = RankExit(2, exit_code=137, reason="OOMKilled", finished_at_ns=entered - 5 * 10**9)
    [finding] = analyze(dumpset, AnalysisOptions(now_ns=entered + 3600 * 10**9), exits={2: died}).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (2,)
    assert "OOMKilled" in finding.summary
    assert any("5 s before the first rank entered all_reduce #6" in e for e in finding.evidence)


def test_a_rank_that_failed_inside_a_young_collective_makes_it_stuck(tmp_path: Path) -> None:
    """Rank 0's collective timeout ended it 3 s into all_reduce #4, while rank 1 never came (it is busy
    elsewhere): the group is no longer merely busy, whatever the stall threshold (seen on a real node,
    where a 5 s gloo timeout is shorter than the operator's 10 s)."""
    per_rank = {0: [b.entry(s) for s in range(1, 4)] + [b.entry(4, state="started")],
                1: [b.entry(s) for s in range(1, 4)]}
    dumpset = load_dumps([b.job(tmp_path, per_rank, 2)])
    young = AnalysisOptions(stall_after_s=10.0, now_ns=b.T0 + 4 * 1_000_000 + 3 * 10**9)
    assert analyze(dumpset, young).findings == []  # no exit known: still within the threshold
    timed_out = RankExit(0, exit_code=1, message="RuntimeError: Timed out waiting 5000ms for recv operation")
    [finding] = analyze(dumpset, young, exits={0: timed_out}).findings
    assert finding.category is Category.RANK_NOT_JOINED and finding.culprit_ranks == (1,)
    assert finding.collective_seq_id == 4 and finding.exits[0].exit_code == 1


def test_a_rank_that_finished_the_collective_and_then_failed_is_the_culprit(tmp_path: Path) -> None:
    """Under gloo, rank 3 finished all_reduce #4 and raised; the ranks still in #4 lost their peer (its
    pod's other rank 2 was stopped by torchrun after finishing #4 too). Without exits it reads as #4
    never completing on ranks 0-1 (the network); with them, the rank that left is the culprit, and
    torchrun's first failure among the two (seen on a real node)."""
    done = [b.entry(s, backend="gloo") for s in range(1, 5)]
    stuck = [*done[:3], b.entry(4, backend="gloo", state="started")]
    dumpset = load_dumps([b.job(tmp_path, {0: stuck, 1: stuck, 2: done, 3: done}, 4)])
    late = AnalysisOptions(stall_after_s=1.0, now_ns=b.T0 + 60 * 10**9)
    [network] = analyze(dumpset, late).findings
    assert network.category is Category.NOT_COMPLETED and network.culprit_ranks == (0, 1)
    exits = {2: RankExit(2, exit_code=1, message="RuntimeError: Connection closed by peer"),
             3: RankExit(3, exit_code=1, message="RuntimeError: lost its shard", first_failure=True)}
    [finding] = analyze(dumpset, late, exits=exits).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (3,)
    assert "finished all_reduce #4" in finding.summary and "lost its shard" in finding.summary
    assert [c.category for c in finding.consequences] == [Category.NOT_COMPLETED]
    assert finding.exits[3].first_failure and any("rank 2 also finished #4" in e for e in finding.evidence)
    # Without the launcher's word on which failed first, both that left are named.
    plain = {r: RankExit(r, exit_code=1) for r in (2, 3)}
    [both] = analyze(dumpset, late, exits=plain).findings
    assert both.culprit_ranks == (2, 3)


NODE = Path(__file__).resolve().parents[1] / "data" / "node"


def test_a_quick_crash_on_the_real_node_is_blamed_on_the_rank_that_raised() -> None:
    """The sidecars' exit pushes of a real torchrun crash: rank 3's (and rank 0's) last recorder is
    empty, ranks 1-2 wait in all_reduce #4 (819 ms into it when read: young), every process is gone.
    Without exits, ranks 0 and 3 left nothing but an empty read before their processes went: no dump
    from them (not the network, not a healthy job); with the exits the kubelet and torchrun's summary
    gave (rank 3 raised, rank 2 lost its peer), rank 3 is the culprit."""
    dumpset = load_dumps([NODE / "torchrun-crash"])
    for options in (None, AnalysisOptions(stall_after_s=0.5)):
        [missing] = analyze(dumpset, options).findings
        assert missing.category is Category.MISSING_DUMPS and missing.culprit_ranks == (0, 3)
    exits = {2: RankExit(2, exit_code=1, message="RuntimeError: [pair.cc:553] Connection closed by peer "
                         "[10.213.0.12]:41234. This is typically caused by a remote worker crashing."),
             3: RankExit(3, exit_code=1, message="RuntimeError: frscope-test: this rank lost its data shard",
                         first_failure=True)}
    report = analyze(load_dumps([NODE / "torchrun-crash"]), exits=exits)
    [finding] = report.findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (3,)
    assert "lost its data shard" in finding.summary and finding.collective_seq_id == 4
    assert 3 in report.missing_ranks  # its empty recorder counts as no dump
    # rank 0 failed too, blaming its peer, and torchrun named it its pod's first failure: still rank 3.
    exits[0] = RankExit(0, exit_code=1, first_failure=True, message=exits[2].message)
    [finding] = analyze(load_dumps([NODE / "torchrun-crash"]), exits=exits).findings
    assert finding.culprit_ranks == (3,)


def test_a_crash_whose_pod_was_never_read_in_full_is_still_blamed_on_the_rank_that_raised() -> None:
    """Another real run: the crashed pod's recorders are both empty, the survivor with entries is 0.9 s
    into #4. Its group has members whose processes failed: #4 can never complete, however young."""
    exits = {2: RankExit(2, exit_code=1, message="RuntimeError: [pair.cc:553] Connection closed by peer. "
                         "This is typically caused by a remote worker crashing."),
             3: RankExit(3, exit_code=1, message="RuntimeError: frscope-test: this rank lost its data shard",
                         first_failure=True)}
    [finding] = analyze(load_dumps([NODE / "torchrun-crash-unread"]), exits=exits).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (3,)
    assert "rank 1 waits in all_reduce #4" in finding.summary


def test_a_victim_that_finished_the_collective_is_not_blamed_over_the_rank_that_raised() -> None:
    """A third real run: rank 2 finished #4 and failed blaming its peer; rank 3, which raised, left an
    empty recorder. The first failure that blames no peer is the culprit, and only rank 1 waits."""
    exits = {2: RankExit(2, exit_code=143, message="RuntimeError: [pair.cc:553] Connection closed by peer "
                         "[10.213.0.13]:63722. This is typically caused by a remote worker crashing."),
             3: RankExit(3, exit_code=1, message="RuntimeError: frscope-test: this rank lost its data shard",
                         first_failure=True)}
    [finding] = analyze(load_dumps([NODE / "torchrun-crash-victim"]), exits=exits).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (3,)
    assert "rank 1 waits in all_reduce #4" in finding.summary


def test_a_crash_before_any_recorder_was_read_is_named_from_the_exits() -> None:
    """On a real node a rank exited (os._exit(3)) a second after joining, before either sidecar found a
    rank socket: no recorder at all, only the kubelet's word. The rank that failed first without
    blaming a peer is named, with its exit."""
    from frscope.records import DumpSet

    nothing = DumpSet(dumps={}, groups={}, world_size=2)
    exits = {0: RankExit(0, exit_code=1, message="RuntimeError: [pair.cc:537] Read error: Connection reset by peer"),
             1: RankExit(1, exit_code=3, message="frscope-test: this rank lost its data shard")}
    [finding] = analyze(nothing, exits=exits).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (1,)
    assert "exited with code 3" in finding.summary and "lost its data shard" in finding.summary
    assert finding.exits[1].exit_code == 3
    assert analyze(nothing).findings[0].category is Category.MISSING_DUMPS  # without exits: nothing to say


def test_a_crash_whose_raising_pod_was_read_empty_is_named_from_every_exit(tmp_path: Path) -> None:
    """A clean-clone CI run on the real node (torchrun, 2 pods x 2 ranks): the crashed pod's sidecar
    pushed both of its ranks with empty recorders (asked while they went down), the other pod's sidecar
    never found its ranks' sockets. Ranks 2-3 were delivered, so not missing; the report named the missing
    victims 0-1 (whose errors blame a peer) and not rank 3, which raised. An empty recorder is no evidence:
    every failed rank without entries counts, and the first failure that blames no peer is named."""
    peer = ("RuntimeError: [pair.cc:553] Connection closed by peer [10.213.0.21]:60590. This is typically "
            "caused by a remote worker crashing.")
    exits = {0: RankExit(0, exit_code=1, message="...in all_reduce | work.wait() | " + peer),
             1: RankExit(1, exit_code=1, message="...in all_reduce | work.wait() | " + peer),
             2: RankExit(2, exit_code=143, message=peer),
             3: RankExit(3, exit_code=1, message="RuntimeError: frscope-test: this rank lost its data shard",
                         first_failure=True)}
    (tmp_path / "half").mkdir()
    (tmp_path / "every").mkdir()
    half = load_dumps([b.job(tmp_path / "half", {2: [], 3: []}, 4)])
    assert half.missing_ranks == (0, 1)
    [finding] = analyze(half, exits=exits).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (3,)
    assert "lost its data shard" in finding.summary and "rank 3 failed first" in finding.summary
    # Every rank delivered, every recorder empty: the same answer.
    every = load_dumps([b.job(tmp_path / "every", {r: [] for r in range(4)}, 4)])
    assert every.missing_ranks == ()
    [finding] = analyze(every, exits=exits).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (3,)


def test_processes_that_failed_after_their_last_read_are_a_finding(tmp_path: Path) -> None:
    """Seen on a real node (tests/node/test_exits.py, a clean-clone CI run): a rank raised between two
    of the sidecars' reads, so every recorder shows its collectives complete, and every process failed
    (the raiser, and its peers on gloo's 'Connection closed by peer'). That is no healthy job: the first
    failure that blames no peer is named, from its exit."""
    per_rank = {r: [b.entry(s, created_ns=b.T0 + s * 1_000_000) for s in range(1, 21)] for r in range(4)}
    dumpset = load_dumps([b.job(tmp_path, per_rank, 4)])
    live = AnalysisOptions(stall_after_s=1.0, now_ns=b.T0 + 21 * 1_000_000)
    peer = "RuntimeError: [pair.cc:553] Connection closed by peer [10.213.0.13]:59042"
    exits = {r: RankExit(r, exit_code=1, message=peer) for r in (0, 1, 2)}
    exits[3] = RankExit(3, exit_code=1, message="RuntimeError: frscope-test: this rank lost its data shard")
    [finding] = analyze(dumpset, live, exits=exits).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (3,)
    assert "lost its data shard" in finding.summary and finding.exits[3].exit_code == 1
    # Processes that ended well (exit 0) leave the job healthy.
    assert analyze(dumpset, live, exits={r: RankExit(r, exit_code=0) for r in range(4)}).findings == []


def test_a_rank_its_launcher_terminated_is_a_victim_beside_one_that_raised(tmp_path: Path) -> None:
    """torchrun, 2 pods x 2 ranks, rank 3 raises; only rank 2's recorder is read. Torchrun names rank 0
    (SIGABRT after 'Connection closed by peer') and SIGTERMs rank 1 in one pod, names rank 2 ('Connection
    closed by peer') in the other. A SIGTERMed rank is its launcher's victim: rank 3, which raised on its
    own, is the culprit, not ranks 1 and 3."""
    peer = ("RuntimeError: [pair.cc:553] Connection closed by peer [10.213.0.20]:47532. This is typically "
            "caused by a remote worker crashing.")
    exits = {0: RankExit(0, exit_code=134, message="work.wait() | " + peer, first_failure=True),
             1: RankExit(1, exit_code=143, message="Signal 15 (SIGTERM) received by PID 10"),
             2: RankExit(2, exit_code=1, message="work.wait() | " + peer, first_failure=True),
             3: RankExit(3, exit_code=1, message="RuntimeError: frscope-test: this rank lost its data shard")}
    entries = [b.entry(s, backend="gloo", created_ns=b.T0 + s * 1_000_000) for s in range(1, 4)]
    waiting = [*entries, b.entry(4, backend="gloo", state="started", created_ns=b.T0 + 4_000_000)]
    dumpset = load_dumps([b.job(tmp_path, {2: waiting}, 4)])
    assert dumpset.missing_ranks == (0, 1, 3)
    [finding] = analyze(dumpset, exits=exits).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (3,), finding.summary
    assert "lost its data shard" in finding.summary
    # A SIGTERM with nobody else failing on its own (a preempted rank, its peers blaming it): that rank.
    preempted = {**{r: RankExit(r, exit_code=1, message=peer) for r in (0, 2, 3)},
                 1: RankExit(1, exit_code=143, message="Signal 15 (SIGTERM) received by PID 10")}
    [finding] = analyze(dumpset, exits=preempted).findings
    assert finding.culprit_ranks == (1,), finding.summary


@pytest.mark.parametrize("seed", range(5))
def test_most_likely_first_over_random_crashes(seed: int) -> None:
    """Randomized: any world size, any mix of victims (errors blaming a peer, SIGTERM from the launcher or
    the kubelet, as 143 or -15), any launcher root-cause flags. One rank that failed on its own is always
    named alone; with none, the SIGTERMed ranks (a preemption); with only peer-blaming ranks, all."""
    import random

    from frscope.records.exits import most_likely_first

    rng = random.Random(seed)
    peer = "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.1]:4000"
    for _ in range(300):
        world = rng.randint(2, 64)
        ranks = list(range(world))
        exits: dict[int, RankExit] = {}
        for r in ranks:
            kind = rng.choice(("peer", "sigterm"))
            exits[r] = (RankExit(r, exit_code=1, message=peer, first_failure=rng.random() < 0.3) if kind == "peer"
                        else RankExit(r, exit_code=rng.choice((143, -15)), message="Signal 15 (SIGTERM) received",
                                      first_failure=rng.random() < 0.3))
        terminated = sorted(r for r, e in exits.items() if e.terminated)
        expected_victims = terminated or ranks
        assert most_likely_first(ranks, exits) == expected_victims
        own = rng.choice(ranks)
        exits[own] = RankExit(own, exit_code=rng.choice((1, 3, 134, 137)), message="RuntimeError: lost its data shard",
                              reason=rng.choice(("Error", "OOMKilled")), first_failure=rng.random() < 0.5)
        assert most_likely_first(ranks, exits) == [own]


def test_without_messages_a_killed_rank_failed_before_the_ones_that_exited_with_an_error() -> None:
    """Exit codes only (no termination messages): gloo peers of a rank that went away raise in Python and
    exit 1; nothing in a peer's failure kills a process by a signal. The SIGKILLed / aborted rank failed
    first. A message on an exit-1 rank (its own error) keeps every rank a candidate; SIGTERM is a teardown."""
    from frscope.records.exits import most_likely_first

    codes = {0: 1, 1: 1, 2: 137, 3: 1}
    exits = {r: RankExit(r, exit_code=c) for r, c in codes.items()}
    assert most_likely_first([0, 1, 2, 3], exits) == [2]
    exits[2] = RankExit(2, exit_code=-6)
    assert most_likely_first([0, 1, 2, 3], exits) == [2]
    exits[0] = RankExit(0, exit_code=1, message="RuntimeError: frscope-test: this rank lost its data shard")
    assert most_likely_first([0, 1, 2, 3], exits) == [0, 1, 2, 3]
    exits = {r: RankExit(r, exit_code=1) for r in range(4)}
    assert most_likely_first([0, 1, 2, 3], exits) == [0, 1, 2, 3]
    exits[2] = RankExit(2, exit_code=143)
    assert most_likely_first([0, 1, 2, 3], exits) == [0, 1, 3]
