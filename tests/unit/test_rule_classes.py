"""The fault classes of issue 23, each as the recorder shape a real gloo job leaves (hand-built with
the builders; the randomized real-torch sweep checks the same classes on real jobs)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from frscope.analysis import AnalysisOptions, Category, Report, analyze
from frscope.records import RankExit, load_dumps
from tests.unit import builders as b

MS = 1_000_000
OLD = AnalysisOptions(now_ns=b.T0 + 3600 * 10**9)
GLOO_DEFAULT = ("0", "default_pg")


def gloo(seq: int, *, done: bool = True, pg: tuple[str, str] = GLOO_DEFAULT, **kw: Any) -> dict[str, Any]:
    """A gloo entry: always 'scheduled'; a finished collective is 'retired'."""
    return b.entry(seq, backend="gloo", pg=pg, state="scheduled", retired=done, **kw)


def write(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], pg_config: dict[str, Any]) -> Path:
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e.setdefault("record_id", i)
        b.write_pickle(tmp_path, rank, b.dump(entries, world=0, pg_config=pg_config))
    return tmp_path


def run(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], pg_config: dict[str, Any],
        options: AnalysisOptions = OLD) -> Report:
    return analyze(load_dumps([write(tmp_path, per_rank, pg_config)]), options)


def test_a_crash_seen_only_in_its_peers_error_path_dump_is_named(tmp_path: Path) -> None:
    """2 ranks; rank 1 died; rank 0 dumped on its error path (gloo retired the failed collective).
    Gloo keys the default group '' in pg_config, here with the ranks [0, 1]: the world is 2, rank 1
    is missing."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
    report = run(tmp_path, {0: [gloo(s) for s in range(1, 6)]}, config)
    assert report.world_size == 2 and report.missing_ranks == (1,)
    [root] = report.findings
    assert root.culprit_ranks == (1,)
    # nothing says rank 1 failed: it is named as the rank that left (crash or exit unknown), not as a crash
    assert root.category in (Category.RANK_STOPPED, Category.MISSING_DUMPS, Category.RANK_NOT_JOINED)


def _arrivals(steps: int, late: dict[int, float] | Callable[[int, int], float],
              groups: Sequence[tuple[str, str, tuple[int, ...]]], world: int) -> dict[int, list[dict[str, Any]]]:
    """A loop of `steps` steps; each step every rank computes (ranks in `late` take that many ms
    longer), then all_reduces in each of `groups` in order (a group's collective completes when its
    last member arrives). Creation times are what gloo would record on one host's clock."""
    per_rank: dict[int, list[dict[str, Any]]] = {r: [] for r in range(world)}
    clock = dict.fromkeys(range(world), 0.0)
    seqs = {name: 0 for name, _desc, _ranks in groups}
    for step in range(steps):
        for rank in range(world):
            clock[rank] += 20.0 + (late(step, rank) if callable(late) else late.get(rank, 0.0))
        for name, desc, ranks in groups:
            seqs[name] += 1
            created = {r: clock[r] + 0.01 for r in ranks}
            done = max(created.values()) + 1.0
            for r in ranks:
                per_rank[r].append(gloo(seqs[name], pg=(name, desc), created_ns=b.T0 + int(created[r] * MS)))
                clock[r] = done
    return per_rank


def test_a_straggler_in_a_two_rank_job_is_named(tmp_path: Path) -> None:
    """Two ranks: no majority to compare with, but rank 1 arrives last at every collective."""
    per_rank = _arrivals(20, {1: 150.0}, [("0", "default_pg", (0, 1))], 2)
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
    [root] = run(tmp_path, per_rank, config).findings
    assert root.category is Category.STRAGGLER and root.culprit_ranks == (1,)


def test_a_compute_straggler_is_named_not_its_tp_peer_that_inherits_its_lateness(tmp_path: Path) -> None:
    """4 ranks, tp groups {0,1} {2,3}, dp groups {0,2} {1,3}: rank 1 computes slowly. Its tp peer rank
    0 waits for it in tp, so rank 0 then reaches the dp group {0,2} late too."""
    groups = [("1", "tp0", (0, 1)), ("2", "tp1", (2, 3)), ("3", "dp0", (0, 2)), ("4", "dp1", (1, 3))]
    per_rank = _arrivals(20, {1: 150.0}, groups, 4)
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              **{name: {"name": name, "desc": desc, "ranks": str(list(ranks))} for name, desc, ranks in groups}}
    report = run(tmp_path, per_rank, config)
    [root] = report.findings
    assert root.category is Category.STRAGGLER and root.culprit_ranks == (1,)
    assert all(c.culprit_ranks != (1,) for c in root.consequences)


def test_a_healthy_job_with_jitter_and_several_groups_has_no_finding(tmp_path: Path) -> None:
    import random

    rng = random.Random(7)
    groups = [("1", "tp0", (0, 1)), ("2", "tp1", (2, 3)), ("3", "dp0", (0, 2)), ("4", "dp1", (1, 3))]
    per_rank = _arrivals(40, lambda _step, _rank: rng.uniform(0, 250), groups, 4)
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              **{name: {"name": name, "desc": desc, "ranks": str(list(ranks))} for name, desc, ranks in groups}}
    assert run(tmp_path, per_rank, config).findings == []


def test_a_crashed_rank_whose_periodic_dump_holds_nothing_of_the_group_is_the_crash(tmp_path: Path) -> None:
    """Rank 1 wrote a periodic dump before the default group's first collective (its recorder holds
    only an early subgroup op), then crashed; ranks 0 and 2 wait in all_reduce #4. Not a network
    problem (NotCompleted): rank 1 stopped."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
              "1": {"name": "1", "desc": "pair", "ranks": "[0, 1]"}}
    pair = ("1", "pair")
    early = [gloo(1, pg=pair, created_ns=b.T0 - 120 * 10**9)]
    survivors = [*early, *(gloo(s, created_ns=b.T0 + s * 10**9) for s in range(1, 4)),
                 gloo(4, done=False, created_ns=b.T0 + 4 * 10**9)]
    per_rank = {0: list(survivors), 1: early, 2: survivors[1:]}
    [root] = run(tmp_path, per_rank, config).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (1,)


def test_an_empty_recorder_beside_a_waiting_peer_says_what_would_decide(tmp_path: Path) -> None:
    """Rank 1's recorder is empty: a stale dump, or a read from before its first collective. Undecidable
    from the recorders (rank 0 waits either way); the finding says the exit codes decide."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    per_rank = {0: [*(gloo(s) for s in range(1, 4)), gloo(4, done=False)], 1: []}
    [root] = run(tmp_path, per_rank, config).findings
    assert any("rank 1" in e and "exit codes decide" in e for e in root.evidence)
    exits = {1: RankExit(1, exit_code=137, reason="Error")}
    [root] = analyze(load_dumps([tmp_path]), OLD, exits=exits).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (1,)


def test_a_rank_behind_collectives_the_others_retired_says_what_decides(tmp_path: Path) -> None:
    """Rank 2's recorder ends at #1, a second before the others' #2-#4, which gloo retired (finished, or
    failed on a timeout or a lost peer: the same record). A crash after a periodic dump and a rank stuck
    in Python while the others timed out leave this same shape: the exit code decides."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    steps = [gloo(s, created_ns=b.T0 + s * 300 * MS) for s in range(1, 5)]
    per_rank = {0: list(steps), 1: list(steps), 2: steps[:1]}
    options = AnalysisOptions(now_ns=b.T0 + 60 * 10**9)
    [root] = run(tmp_path, per_rank, config, options).findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (2,)
    assert any("exit code decides" in e for e in root.evidence)
    exits = {2: RankExit(2, exit_code=137, reason="OOMKilled")}
    [root] = analyze(load_dumps([tmp_path]), options, exits=exits).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (2,)


def _loop(steps: int, layout: list[tuple[str, str]], ranks_in: dict[str, tuple[int, ...]], world: int,
          skip: tuple[int, int, str] | None = None, created_at_skip: int = 0) -> dict[int, list[dict[str, Any]]]:
    """Every rank runs `steps` steps of the collectives in `layout` (groups it belongs to only); `skip`:
    (rank, step, group) skips that group's collective at that step. The open ones (from the skip on) are
    not retired; every rank's first open entry is created at the same moment (`created_at_skip`)."""
    per_rank: dict[int, list[dict[str, Any]]] = {r: [] for r in range(world)}
    for rank in range(world):
        seqs = dict.fromkeys(ranks_in, 0)
        blocked = False
        for step in range(steps):
            for name, desc in layout:
                if rank not in ranks_in[name]:
                    continue
                if skip is not None and (rank, step, name) == skip:
                    continue
                seqs[name] += 1
                at_skip = skip is not None and step >= skip[1]
                created = b.T0 + (created_at_skip if at_skip and not blocked else step * 10**9 + seqs[name] * MS)
                per_rank[rank].append(gloo(seqs[name], pg=(name, desc), done=not at_skip, created_ns=created))
                if at_skip:
                    blocked = True
                    break
            if blocked:
                break
    return per_rank


def test_a_subgroup_skip_in_a_cycle_with_the_default_group_blames_the_skipper(tmp_path: Path) -> None:
    """Each step: one all_reduce on the subgroup {0, 1}, then four on the default group. At step 2 rank 1
    skips the subgroup's: rank 0 sits in it, rank 1 waits in the default group's with 2 and 3. The open
    entries were created within the same millisecond: only the ranks' loops tell who broke the order."""
    layout = [("1", "param_sync"), *[("0", "default_pg")] * 4]
    ranks_in = {"0": (0, 1, 2, 3), "1": (0, 1)}
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              "1": {"name": "1", "desc": "param_sync", "ranks": "[0, 1]"}}
    for skip_step in (2, 3):
        directory = tmp_path / str(skip_step)
        directory.mkdir()
        per_rank = _loop(6, layout, ranks_in, 4, skip=(1, skip_step, "1"), created_at_skip=10**9 * 30)
        [root] = run(directory, per_rank, config).findings
        assert root.culprit_ranks == (1,), (skip_step, root.summary)
        assert root.process_group.name == "1"


def test_an_order_inversion_between_two_groups_blames_the_rank_that_broke_its_loop(tmp_path: Path) -> None:
    """Each step all_reduces on group a, then on group b (both [0, 1, 2]). At step 3 rank 2 issues b's
    first. Ranks 0 and 1 sit in a #4, rank 2 in b #4, all created within the same millisecond."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
              "1": {"name": "1", "desc": "a", "ranks": "[0, 1, 2]"},
              "2": {"name": "2", "desc": "b", "ranks": "[0, 1, 2]"}}
    a, g = ("1", "a"), ("2", "b")
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(3):
        entries = []
        for step in range(1, 4):
            entries += [gloo(step, pg=a, created_ns=b.T0 + step * 10**9),
                        gloo(step, pg=g, created_ns=b.T0 + step * 10**9 + MS)]
        first = g if rank == 2 else a
        entries.append(gloo(4, pg=first, done=False, created_ns=b.T0 + 4 * 10**9 + (0 if rank == 2 else 1)))
        per_rank[rank] = entries
    [root] = run(tmp_path, per_rank, config).findings
    assert root.culprit_ranks == (2,) and root.process_group.name == "1"
    # Decided by its peers: after a #3 both others went to a, it went to b.
    assert any("broke the order its peers kept" in e for e in root.evidence)


def test_an_all_to_all_whose_splits_do_not_balance_on_one_rank_names_that_rank(tmp_path: Path) -> None:
    """Shape of a real gloo run (4 ranks, 15 s timeout): rank 1's all_to_all_single failed gloo's split
    check at once and was retired; ranks 0, 2, 3 never completed it. Read 5 minutes later."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}
    per_rank = {}
    for rank in range(4):
        entries = [gloo(s, sizes=[[4]]) for s in range(1, 4)]
        a2a = gloo(4, op="all_to_all", sizes=[[8]], done=rank == 1, created_ns=b.T0 + 4 * MS)
        a2a["timeout_ms"] = 15_000
        per_rank[rank] = [*entries, a2a]
    report = run(tmp_path, per_rank, config, AnalysisOptions(now_ns=b.T0 + 300 * 10**9))
    [root] = report.findings
    assert root.category is Category.SIZE_MISMATCH and root.culprit_ranks == (1,)
    assert root.stalled_for_s is not None and root.stalled_for_s <= 15
    assert root.age_source is not None and "timeout" in root.age_source


C10D = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"


def _stack(*frames: tuple[str, str, int]) -> str:
    lines = ["Thread 0x00007f53d0d9c000 (most recent call first):"]
    lines += [f'  File "{file}", line {line} in {name}' for name, file, line in frames]
    return "\n".join(lines) + "\n"


def _snapshots(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], stacks: dict[int, str],
               pg_config: dict[str, Any], captured: dict[int, int] | None = None) -> Report:
    from frscope.wire import snapshot_piece

    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e.setdefault("record_id", i)
        at = (captured or {}).get(rank, b.T0 + 3600 * 10**9)
        piece = snapshot_piece(rank, at, "worker-server", stacks.get(rank),
                               b.dump(entries, world=0, pg_config=pg_config))
        b.write_json(tmp_path, rank, piece)
    return analyze(load_dumps([tmp_path]), OLD)


def test_two_last_ranks_receiving_from_each_other_are_named_not_the_rank_before_them(tmp_path: Path) -> None:
    """Sweep shape (4 ranks): 2 and 3 both recv from each other first; 0 and 1 wait in the all_reduce.
    A pipeline stage 1 that skipped its send to 2 would leave the same stacks (they carry no peer):
    the closed pair is named, both of its ranks, as candidates: whether one of them or both broke the order
    the stacks cannot tell."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}
    done = [gloo(s) for s in range(1, 4)]
    per_rank = {r: [*done, gloo(4, done=False)] if r in (0, 1) else list(done) for r in range(4)}
    stacks = {r: _stack(("all_reduce", C10D, 2800), ("step", "/app/train.py", 40)) for r in (0, 1)}
    stacks |= {r: _stack(("recv", C10D, 2400), ("exchange_halo", "/app/train.py", 31)) for r in (2, 3)}
    [root] = _snapshots(tmp_path, per_rank, stacks, config).findings
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (2, 3) and root.ambiguous


def test_a_p2p_deadlock_whose_one_rank_waits_at_another_call_site_names_that_rank(tmp_path: Path) -> None:
    """4 ranks all blocked in recv (none makes progress); three wait at the pipeline's recv, rank 2 at a
    recv elsewhere (a wrong peer): the odd call site is the culprit, not a candidate list of four."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}
    per_rank = {r: [gloo(s) for s in range(1, 4)] for r in range(4)}
    stacks = {r: _stack(("recv", C10D, 2400), ("stage_forward", "/app/train.py", 31)) for r in (0, 1, 3)}
    stacks[2] = _stack(("recv", C10D, 2400), ("exchange_halo", "/app/train.py", 77))
    [root] = _snapshots(tmp_path, per_rank, stacks, config).findings
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (2,) and not root.ambiguous


def test_a_rank_whose_worker_server_never_answers_is_the_unresponsive_suspect(tmp_path: Path) -> None:
    """Rank 2 holds the GIL in a long C call: its sidecar got no answer (the envelope names it), so
    it has no piece; ranks 0, 1, 3 wait in all_reduce #4."""
    from frscope.wire import snapshot_envelope_bytes, snapshot_head, snapshot_piece

    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}
    pieces = []
    for rank in (0, 1, 3):
        entries = [*(gloo(s) for s in range(1, 4)), gloo(4, done=False)]
        for i, e in enumerate(entries):
            e["record_id"] = i
        piece = snapshot_piece(rank, b.T0 + 3600 * 10**9, "worker-server", None, b.dump(entries, world=0,
                                                                                         pg_config=config))
        pieces.append(json.dumps(piece).encode())
    head = snapshot_head(pod="job-0", namespace="ns", node="n", captured_at_ns=b.T0 + 3600 * 10**9, reason="stall")
    body = snapshot_envelope_bytes(head, pieces, [{"rank": 2, "message": "rank-2.sock: no answer within 5 s"}])
    (tmp_path / "job-0.json").write_bytes(body)
    report = analyze(load_dumps([tmp_path], world_size=4), OLD)
    [root] = report.findings
    assert root.culprit_ranks == (2,)
    assert "did not answer" in root.summary and "all_reduce #4" in root.summary


def test_two_ranks_stuck_at_once_are_named_together(tmp_path: Path) -> None:
    """2 x 2 grid: ranks 2 and 3 (one node) are stuck in Python after tp #3; rank 0 waits for rank 2 in
    dp {0, 2}, rank 1 for rank 3 in dp {1, 3}. Two groups, two blamed ranks, one cause."""
    groups = {"1": ("tp0", (0, 1)), "2": ("tp1", (2, 3)), "3": ("dp0", (0, 2)), "4": ("dp1", (1, 3))}
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              **{n: {"name": n, "desc": d, "ranks": str(list(rs))} for n, (d, rs) in groups.items()}}
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(4):
        tp = next(n for n, (d, rs) in groups.items() if d.startswith("tp") and rank in rs)
        dp = next(n for n, (d, rs) in groups.items() if d.startswith("dp") and rank in rs)
        entries = []
        for step in range(1, 4):
            entries.append(gloo(step, pg=(tp, groups[tp][0]), created_ns=b.T0 + step * 10**9))
            if step < 3 or rank in (0, 1):
                entries.append(gloo(step, pg=(dp, groups[dp][0]), done=step < 3, created_ns=b.T0 + step * 10**9 + MS))
        per_rank[rank] = entries
    [root] = run(tmp_path, per_rank, config).findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (2, 3)
    assert len(root.consequences) == 2


def test_an_all_to_all_sender_with_one_split_too_many_is_named_though_its_receiver_left_no_dump(
        tmp_path: Path) -> None:
    """Real sweep shape (4 ranks): rank 2 sends 9 elements and expects 8; rank 0, receiving one more than
    it expects, aborted without a dump; the others' next all_reduce failed and was retired."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}
    per_rank = {}
    for rank in (1, 2, 3):
        a2a = gloo(4, op="all_to_all", sizes=[[9 if rank == 2 else 8]], out_sizes=[[8]])
        per_rank[rank] = [*(gloo(s) for s in range(1, 4)), a2a, gloo(5)]
    [root, *_] = run(tmp_path, per_rank, config).findings
    assert root.category is Category.SIZE_MISMATCH and root.culprit_ranks == (2,)


def test_an_uneven_all_to_all_whose_totals_balance_is_healthy(tmp_path: Path) -> None:
    """Routed tokens: ranks 0 and 1 send 10 and 6 and receive 6 and 10; every member is there."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}
    sizes = {0: (10, 6), 1: (6, 10), 2: (8, 8), 3: (8, 8)}
    per_rank = {r: [gloo(1), gloo(2, op="all_to_all", sizes=[[i]], out_sizes=[[o]]), gloo(3)]
                for r, (i, o) in sizes.items()}
    assert run(tmp_path, per_rank, config).findings == []


def test_a_rank_that_exited_cleanly_while_its_peer_went_on_is_the_culprit(tmp_path: Path) -> None:
    """Uneven data, 2 ranks: rank 1 ran out of batches and exited 0 (its recorder was last read empty);
    rank 0's next all_reduce failed blaming its peer."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    write(tmp_path, {0: [gloo(1), gloo(2)], 1: []}, config)
    exits = {0: RankExit(0, exit_code=1, message="RuntimeError: Connection closed by peer [127.0.0.1]:5000. This "
                         "is typically caused by a remote worker crashing."),
             1: RankExit(1, exit_code=0, reason="Completed")}
    [root] = analyze(load_dumps([tmp_path]), OLD, exits=exits).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (1,)
    assert "exit code 0" in root.summary


def test_a_recorder_read_before_the_others_began_what_it_lacks_is_stale(tmp_path: Path) -> None:
    """Crash after a periodic read: rank 2's last read (0.3 s before the others began #4) ends at #3; the
    others' #4 and #5 were retired as they failed. Gloo's '' pg_config: membership from the entries."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}}
    steps = [gloo(s, created_ns=b.T0 + s * 300 * MS) for s in range(1, 6)]
    per_rank = {0: list(steps), 1: list(steps), 2: steps[:3]}
    captured = {0: b.T0 + 1600 * MS, 1: b.T0 + 1600 * MS, 2: b.T0 + 950 * MS}
    [root] = _snapshots(tmp_path, per_rank, {}, config, captured).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (2,)


def test_a_recorder_read_after_the_others_began_what_it_lacks_never_joined(tmp_path: Path) -> None:
    """Same recorders, but rank 2 was read after the others began #4 (as after their collective
    timeout): it never joined #4."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}}
    steps = [gloo(s, created_ns=b.T0 + s * 300 * MS) for s in range(1, 6)]
    per_rank = {0: list(steps), 1: list(steps), 2: steps[:3]}
    captured = {0: b.T0 + 1600 * MS, 1: b.T0 + 1600 * MS, 2: b.T0 + 1590 * MS}
    [root] = _snapshots(tmp_path, per_rank, {}, config, captured).findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (2,)


def test_a_skip_one_collective_before_the_blocked_one_is_found_in_the_skippers_loop(tmp_path: Path) -> None:
    """Sweep shape (2 x 2 grid, each step tp, dp, world): rank 2 skipped tp #3, finished dp #3 with rank
    0 and waits in world #3; rank 3 waits in tp #3, rank 1 in dp #3 for rank 3, rank 0 in world #3.
    A three-group cycle; rank 2 left its loop one collective before the one it is blocked in."""
    names = {"1": "tp", "2": "tp", "3": "dp", "4": "dp"}
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              **{n: {"name": n, "desc": d, "ranks": r} for n, d, r in
                 (("1", "tp", "[0, 1]"), ("2", "tp", "[2, 3]"), ("3", "dp", "[0, 2]"), ("4", "dp", "[1, 3]"))}}
    order = {0: [("1", 1, 1), ("3", 1, 1), ("0", 1, 1), ("1", 2, 1), ("3", 2, 1), ("0", 2, 1), ("1", 3, 1),
                 ("3", 3, 1), ("0", 3, 0)],
             1: [("1", 1, 1), ("4", 1, 1), ("0", 1, 1), ("1", 2, 1), ("4", 2, 1), ("0", 2, 1), ("1", 3, 1),
                 ("4", 3, 0)],
             2: [("2", 1, 1), ("3", 1, 1), ("0", 1, 1), ("2", 2, 1), ("3", 2, 1), ("0", 2, 1), ("3", 3, 1),
                 ("0", 3, 0)],
             3: [("2", 1, 1), ("4", 1, 1), ("0", 1, 1), ("2", 2, 1), ("4", 2, 1), ("0", 2, 1), ("2", 3, 0)]}
    per_rank = {r: [gloo(seq, pg=(g, names.get(g, "default_pg")), done=bool(done),
                         created_ns=b.T0 + i * MS) for i, (g, seq, done) in enumerate(ops)]
                for r, ops in order.items()}
    [root] = run(tmp_path, per_rank, config).findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (2,)
    assert root.process_group.name == "2"


def test_two_non_adjacent_ranks_receiving_from_each_other_are_both_named(tmp_path: Path) -> None:
    """7 ranks: 2 and 4 both recv from each other first; the rest wait in the all_reduce for them.
    No chain of stages (the receivers do not reach the last rank): both are named, as candidates (one of
    them, or both, received first)."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3, 4, 5, 6]"}}
    done = [gloo(s) for s in range(1, 4)]
    per_rank = {r: list(done) if r in (2, 4) else [*done, gloo(4, done=False)] for r in range(7)}
    stacks = {r: _stack(("all_reduce", C10D, 2800), ("step", "/app/train.py", 40)) for r in range(7)}
    stacks |= {r: _stack(("recv", C10D, 2400), ("exchange_halo", "/app/train.py", 77)) for r in (2, 4)}
    [root] = _snapshots(tmp_path, per_rank, stacks, config).findings
    assert root.category is Category.P2P_MISMATCH and root.culprit_ranks == (2, 4) and root.ambiguous


def test_an_order_swap_in_the_first_step_is_found_against_the_other_ranks_program(tmp_path: Path) -> None:
    """Sweep shape (3 x 2 grid, each step tp, dp, world): at step 2 rank 3 calls world before tp. With
    one step of history it has no loop of its own; the other ranks' order after world #1 decides."""
    groups = {"1": ("tp", (0, 1)), "2": ("tp", (2, 3)), "3": ("tp", (4, 5)), "4": ("dp", (0, 2, 4)),
              "5": ("dp", (1, 3, 5))}
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3, 4, 5]"},
              **{n: {"name": n, "desc": d, "ranks": str(list(rs))} for n, (d, rs) in groups.items()}}
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(6):
        tp = next(n for n, (d, rs) in groups.items() if d == "tp" and rank in rs)
        dp = next(n for n, (d, rs) in groups.items() if d == "dp" and rank in rs)
        ops = [(tp, "tp", 1, 1), (dp, "dp", 1, 1), ("0", "default_pg", 1, 1)]
        if rank == 3:
            ops.append(("0", "default_pg", 2, 0))
        elif rank == 2:
            ops.append((tp, "tp", 2, 0))
        elif rank in (1, 5):
            ops += [(tp, "tp", 2, 1), (dp, "dp", 2, 0)]  # dp {1, 3, 5} waits for rank 3
        else:
            ops += [(tp, "tp", 2, 1), (dp, "dp", 2, 0)]  # dp {0, 2, 4} waits for rank 2
        per_rank[rank] = [gloo(seq, pg=(g, d), done=bool(done), created_ns=b.T0 + i * MS)
                          for i, (g, d, seq, done) in enumerate(ops)]
    [root] = run(tmp_path, per_rank, config).findings
    assert root.culprit_ranks == (3,), root.summary


def test_a_killed_rank_without_a_dump_is_the_root_over_a_victim_whose_recorder_lags(tmp_path: Path) -> None:
    """Rank 2 was SIGKILLed (no dump). Rank 1's subgroup collective with it failed, so rank 1 never
    reached world #3, which ranks 0 and 3 recorded (retired as it failed): rank 1 looks stale, but its
    own error blames the peer that went away."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              "1": {"name": "1", "desc": "pair", "ranks": "[1, 2]"}}
    pair = ("1", "pair")
    base = [gloo(1), gloo(2)]
    per_rank = {0: [*base, gloo(3)], 3: [*base, gloo(3)], 1: [*base, gloo(1, pg=pair), gloo(2, pg=pair)]}
    write(tmp_path, per_rank, config)
    peer = "RuntimeError: Read error: Connection reset by peer. This is typically caused by a remote worker hanging"
    exits = {0: RankExit(0, exit_code=1, message=peer), 1: RankExit(1, exit_code=1, message=peer),
             2: RankExit(2, exit_code=137, reason="OOMKilled"), 3: RankExit(3, exit_code=1, message=peer)}
    [root] = analyze(load_dumps([tmp_path]), OLD, exits=exits).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (2,)


def test_a_rank_that_exited_cleanly_without_a_dump_while_its_peers_wait_is_the_culprit(tmp_path: Path) -> None:
    """Uneven data, 3 ranks: rank 2 ran out of batches, exited 0 and left no dump; ranks 0 and 1 wait
    in all_reduce #3."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    write(tmp_path, {r: [gloo(1), gloo(2), gloo(3, done=False)] for r in (0, 1)}, config)
    exits = {2: RankExit(2, exit_code=0, reason="Completed")}
    [root] = analyze(load_dumps([tmp_path]), OLD, exits=exits).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (2,)


def test_a_swap_whose_skipped_group_is_outside_the_cycle_names_the_swapper(tmp_path: Path) -> None:
    """2 x 2 grid, each step tp, dp, world. At step 3 rank 2 calls world before tp: rank 0 waits for it
    in dp {0, 2}, which with world forms the cycle; the group rank 2 skipped (tp {2, 3}) is outside it."""
    names = {"1": "tp", "2": "tp", "3": "dp", "4": "dp"}
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
              **{n: {"name": n, "desc": d, "ranks": r} for n, d, r in
                 (("1", "tp", "[0, 1]"), ("2", "tp", "[2, 3]"), ("3", "dp", "[0, 2]"), ("4", "dp", "[1, 3]"))}}
    tp = {0: "1", 1: "1", 2: "2", 3: "2"}
    dp = {0: "3", 1: "4", 2: "3", 3: "4"}
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(4):
        ops = [(g, step, 1) for step in (1, 2) for g in (tp[rank], dp[rank], "0")]
        if rank == 2:
            ops.append(("0", 3, 0))
        elif rank == 3:
            ops.append((tp[rank], 3, 0))
        else:
            ops += [(tp[rank], 3, 1), (dp[rank], 3, 0)]
        per_rank[rank] = [gloo(seq, pg=(g, names.get(g, "default_pg")), done=bool(done), created_ns=b.T0 + i * MS)
                          for i, (g, seq, done) in enumerate(ops)]
    [root] = run(tmp_path, per_rank, config).findings
    assert root.culprit_ranks == (2,) and root.process_group.name == "2", root.summary


def test_a_rank_stuck_in_teardown_read_after_the_others_failed_is_named(tmp_path: Path) -> None:
    """At the end every rank calls barrier; rank 1 went straight to destroy_process_group and is stuck
    there. Gloo failed the others' barrier a few ms in (retired); rank 1 was read 3 s later, still not in it."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}
    steps = [gloo(s, created_ns=b.T0 + s * 300 * MS) for s in range(1, 6)]
    per_rank = {r: [*steps, gloo(6, op="barrier", created_ns=b.T0 + 1810 * MS)] for r in (0, 2, 3)}
    per_rank[1] = list(steps)
    captured = {0: b.T0 + 1830 * MS, 2: b.T0 + 1840 * MS, 3: b.T0 + 1850 * MS, 1: b.T0 + 4900 * MS}
    stacks = {1: _stack(("join_workers", "/app/train.py", 355), ("teardown", "/app/train.py", 350))}
    report = _snapshots(tmp_path, per_rank, stacks, config, captured)
    [root] = analyze(load_dumps([tmp_path]), AnalysisOptions(stall_after_s=2.0)).findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (1,)
    assert report.findings  # also with the hour-later 'now' the helper uses


def test_a_rank_whose_last_subgroup_lost_an_unseen_member_is_not_blamed_over_the_missing_rank(
        tmp_path: Path) -> None:
    """4 ranks, strided subgroups {0, 2} and {1, 3} (gloo's '' pg_config: membership from the entries).
    Rank 0 raised and left no dump; rank 2's subgroup collective with it failed, so rank 2 never reached
    world #3, which ranks 1 and 3 entered (retired as it failed). The subgroup seen as {2} is smaller than
    its sibling {1, 3}: a member left no dump, and rank 2 stopped there."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
    a, c = ("1", "strided"), ("2", "strided")
    per_rank = {2: [gloo(1, pg=a), gloo(1), gloo(2, pg=a), gloo(2), gloo(3, pg=a)],
                1: [gloo(1, pg=c), gloo(1), gloo(2, pg=c), gloo(2), gloo(3, pg=c), gloo(3)],
                3: [gloo(1, pg=c), gloo(1), gloo(2, pg=c), gloo(2), gloo(3, pg=c), gloo(3)]}
    for entries in per_rank.values():
        for i, e in enumerate(entries):
            e["time_created_ns"] = b.T0 + i * 300 * MS
    report = analyze(load_dumps([write(tmp_path, per_rank, config)], world_size=4), OLD)
    assert report.findings[0].culprit_ranks == (0,)


def test_a_pipeline_stage_stuck_without_stacks_gives_two_candidates(tmp_path: Path) -> None:
    """6 stages, pickle form: stage 4 is stuck before its recv; stage 3's send to it waits, stage 5 waits
    in recv. Only the world all_reduce shows it: ranks 3-5 never joined. The stuck stage is the first or
    the second of them."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
    done = [gloo(s) for s in range(1, 4)]
    per_rank = {r: [*done, gloo(4, done=False)] if r < 3 else list(done) for r in range(6)}
    [root] = run(tmp_path, per_rank, config).findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (3, 4) and root.ambiguous
    assert any("Live stacks decide" in e for e in root.evidence)


def test_a_recorder_read_before_the_others_began_a_collective_some_still_wait_in_is_stale(tmp_path: Path) -> None:
    """Crash after a periodic read, 3 ranks: rank 2's last read (0.3 s before the others began #4) ends
    at #3; rank 1's #4 failed (retired) and rank 0 was read while still waiting in it. Nobody finished
    #4 for certain, yet the read is older than #4: the collector kept it because the rank was gone."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}}
    steps = [gloo(s, created_ns=b.T0 + s * 300 * MS) for s in range(1, 5)]
    per_rank = {0: [*steps[:3], gloo(4, done=False, created_ns=b.T0 + 1200 * MS)], 1: list(steps), 2: steps[:3]}
    captured = {0: b.T0 + 1600 * MS, 1: b.T0 + 1600 * MS, 2: b.T0 + 900 * MS}
    [root] = _snapshots(tmp_path, per_rank, {}, config, captured).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (2,)


def test_the_last_rank_of_a_grid_that_left_no_dump_is_named_once_the_world_size_is_known(tmp_path: Path) -> None:
    """2x2 dp x tp with gloo: pg_config's '' entry lists [0, 1] and rank 3 (holding the GIL) left no dump,
    so no dump names it. A description says nothing of a group's size (groups of one description may be
    uneven), so no rank 3 is invented from the 'tp' groups: the ranks wait in groups nobody else entered.
    Given the world size (`--world-size 4`), rank 3 is missing and it is the one rank 2 waits for in tp
    and rank 1 in dp."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
    tp0, tp1, dp0, dp1 = ("1", "tp"), ("2", "tp"), ("3", "dp"), ("4", "dp")
    per_rank = {
        0: [gloo(1), gloo(1, pg=tp0), gloo(1, pg=dp0, done=False)],
        1: [gloo(1), gloo(1, pg=tp0), gloo(1, pg=dp1, done=False)],
        2: [gloo(1), gloo(1, pg=tp1, done=False)],
    }
    unknown = run(tmp_path, per_rank, config)
    assert unknown.world_size == 3 and unknown.missing_ranks == ()
    (tmp_path / "known").mkdir()
    report = analyze(load_dumps([write(tmp_path / "known", per_rank, config)], world_size=4), OLD)
    assert report.world_size == 4 and report.missing_ranks == (3,)
    assert report.findings[0].culprit_ranks == (3,)
    assert report.findings[0].category in (Category.MISSING_DUMPS, Category.RANK_NOT_JOINED)


def test_a_rank_whose_last_collective_failed_waiting_for_a_stuck_peer_is_not_named_with_it(tmp_path: Path) -> None:
    """2x2 dp x tp: rank 3 is stuck in Python before tp #2. Rank 2 waited in tp #2 until gloo timed it out
    (retired, as if finished), so it never joined dp #2, where rank 0 waits. Rank 2 is not a second rank
    stuck outside any collective: its tp #2 cannot have finished without rank 3, which never entered it."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
    tp0, tp1, dp0, dp1 = ("1", "tp"), ("2", "tp"), ("3", "dp"), ("4", "dp")
    per_rank = {
        0: [gloo(1, pg=tp0), gloo(1, pg=dp0), gloo(2, pg=tp0), gloo(2, pg=dp0, done=False)],
        1: [gloo(1, pg=tp0), gloo(1, pg=dp1), gloo(2, pg=tp0), gloo(2, pg=dp1, done=False)],
        2: [gloo(1, pg=tp1), gloo(1, pg=dp0), gloo(2, pg=tp1)],
        3: [gloo(1, pg=tp1), gloo(1, pg=dp1)],
    }
    [root] = run(tmp_path, per_rank, config).findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (3,)


def test_a_recorder_read_just_after_the_others_began_the_next_collective_but_before_the_one_after_is_stale(
        tmp_path: Path) -> None:
    """Rank 2's last read (10 ms after the others began #4) ends at #3; the others finished #4 and began
    #5 0.29 s after that read. A member begins #5 only after #4 returned, and #4 needs rank 2: its read
    is older than what the others did next, so the dump is stale, not a rank that never joined #4."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}}
    steps = [gloo(s, created_ns=b.T0 + s * 300 * MS) for s in range(1, 6)]
    per_rank = {0: list(steps), 1: list(steps), 2: steps[:3]}
    captured = {0: b.T0 + 1600 * MS, 1: b.T0 + 1600 * MS, 2: b.T0 + 1210 * MS}
    [root] = _snapshots(tmp_path, per_rank, {}, config, captured).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (2,)


def test_a_rank_missing_from_a_collective_its_peer_waits_in_says_what_decides_without_stacks(tmp_path: Path) -> None:
    """Copied files, no stacks, no exit codes: rank 0 idle after #2 while rank 1 waits in #3. Stuck in
    Python or ended after a periodic dump: the finding names rank 0 and says the exit code decides."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    per_rank = {0: [gloo(1), gloo(2)], 1: [gloo(1), gloo(2), gloo(3, done=False)]}
    [root] = run(tmp_path, per_rank, config).findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (0,)
    assert any("exit code decides" in e for e in root.evidence)


def test_a_rank_held_in_a_subgroup_by_a_killed_peer_is_not_stale_in_the_default_group(tmp_path: Path) -> None:
    """2x2 dp x tp, collective timeout: rank 2 hung before dp #1 (killed later: 137, no dump). Rank 0 waited
    in dp #1 with it until gloo timed that out (retired), so it never entered the default group's #1,
    which ranks 1 and 3 recorded as retired too. Rank 0's recorder is not stale: it was held by rank 2."""
    config = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
    world, tp0, tp1, dp0, dp1 = GLOO_DEFAULT, ("1", "tp"), ("2", "tp"), ("3", "dp"), ("4", "dp")
    at = [{"created_ns": b.T0 + step * 300 * MS} for step in range(4)]
    per_rank = {
        0: [gloo(1, pg=tp0, **at[1]), gloo(1, pg=dp0, **at[2])],
        1: [gloo(1, pg=tp0, **at[1]), gloo(1, pg=dp1, **at[2]), gloo(1, pg=world, **at[3])],
        3: [gloo(1, pg=tp1, **at[1]), gloo(1, pg=dp1, **at[2]), gloo(1, pg=world, **at[3])],
    }
    write(tmp_path, per_rank, config)
    timed_out = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation"
    exits = {r: RankExit(r, exit_code=1, message=timed_out) for r in (0, 1, 3)}
    exits[2] = RankExit(2, exit_code=137, reason="Error")
    report = analyze(load_dumps([tmp_path]), OLD, exits=exits)
    assert report.missing_ranks == (2,)
    assert report.findings[0].culprit_ranks == (2,) and report.findings[0].category is Category.RANK_STOPPED


def test_an_empty_recorder_read_clearly_before_the_others_latest_collective_is_a_rank_that_stopped(
        tmp_path: Path) -> None:
    """Uneven data: rank 1 ran out of batches and exited; its last read (empty) came 50 ms before the
    others' #1 and 0.4 s before their #2, both of which they retired (failed without it). The read is dated:
    it is older than what the others did next, not a rank that never joined."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    steps = [gloo(s, created_ns=b.T0 + (s - 1) * 350 * MS) for s in (1, 2)]
    per_rank: dict[int, list[dict[str, Any]]] = {0: list(steps), 1: [], 2: list(steps)}
    captured = {0: b.T0 + 400 * MS, 1: b.T0 - 50 * MS, 2: b.T0 + 400 * MS}
    [root] = _snapshots(tmp_path, per_rank, {}, config, captured).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (1,)


def test_a_young_wait_for_a_rank_whose_process_is_gone_is_a_hang(tmp_path: Path) -> None:
    """Ranks 0 and 2 entered all_reduce #3 0.2 s before the envelope was taken; rank 1 never did, and its
    sidecar says its socket is gone. Young, but it can never complete: rank 1 is named."""
    from frscope.wire import snapshot_envelope_bytes, snapshot_head, snapshot_piece

    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    steps = [gloo(s, created_ns=b.T0 + s * 300 * MS) for s in (1, 2)]
    waiting = gloo(3, done=False, created_ns=b.T0 + 900 * MS)
    pieces = []
    for rank, entries in {0: [*steps, waiting], 1: list(steps), 2: [*steps, dict(waiting)]}.items():
        for i, e in enumerate(entries):
            e["record_id"] = i
        read = b.T0 + (890 if rank == 1 else 1100) * MS
        pieces.append(json.dumps(snapshot_piece(rank, read, "worker-server", None,
                                                b.dump(entries, world=0, pg_config=config))).encode())
    head = snapshot_head(pod="job-0", namespace="ns", node="n", captured_at_ns=b.T0 + 1100 * MS, reason="stall")
    body = snapshot_envelope_bytes(head, pieces, [{"rank": 1, "message": "rank-1.sock: socket is gone"}])
    (tmp_path / "job-0.json").write_bytes(body)
    options = AnalysisOptions(stall_after_s=2.0)
    [root] = analyze(load_dumps([tmp_path]), options).findings
    assert root.category is Category.RANK_NOT_JOINED and root.culprit_ranks == (1,)


def test_a_gone_rank_whose_first_missing_collective_ended_long_before_its_timeout_is_stale(tmp_path: Path) -> None:
    """Rank 2's last read came 20 ms before the others began #3 (too close to date it stale by itself), and
    its sidecar says its socket is gone. The others recorded #3 done 0.3 s after it began, with a 10 min
    timeout: it finished with rank 2 (so the read is older) or failed as rank 2 went away. Not a hang."""
    from frscope.wire import snapshot_envelope_bytes, snapshot_head, snapshot_piece

    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    steps = [gloo(s, created_ns=b.T0 + s * 300 * MS) for s in (1, 2, 3)]
    pieces = []
    for rank, entries in {0: list(steps), 1: [dict(e) for e in steps], 2: [dict(e) for e in steps[:2]]}.items():
        for i, e in enumerate(entries):
            e["record_id"] = i
        read = b.T0 + (880 if rank == 2 else 1200) * MS
        pieces.append(json.dumps(snapshot_piece(rank, read, "worker-server", None,
                                                b.dump(entries, world=0, pg_config=config))).encode())
    head = snapshot_head(pod="job-0", namespace="ns", node="n", captured_at_ns=b.T0 + 1300 * MS, reason="stall")
    errors = [{"rank": 2, "message": "rank-2.sock: socket is gone"}]
    (tmp_path / "job-0.json").write_bytes(snapshot_envelope_bytes(head, pieces, errors))
    [root] = analyze(load_dumps([tmp_path]), AnalysisOptions(stall_after_s=2.0)).findings
    assert root.category is Category.RANK_STOPPED and root.culprit_ranks == (2,)
