"""The fault sweep's own rules (frscope/testing/sweep): what a seed draws, what counts as a right verdict,
how torchfrtrace's output is read. The sweep's numbers are only as good as these."""

from __future__ import annotations

from frscope.analysis import Category, Finding, GroupRef, Report
from frscope.testing.sweep.capture import truth_of
from frscope.testing.sweep.classes import CLASSES
from frscope.testing.sweep.score import judge, parse_torchfrtrace
from frscope.testing.sweep.spec import JobSpec, draw_jobs, groups_of

WORLD = GroupRef("0", "default_pg", (0, 1, 2, 3))


def _report(*findings: Finding) -> Report:
    return Report(list(findings), (0, 1, 2, 3), (), 4, [], [], "gloo", ("2.10",))


def _finding(category: Category, ranks: tuple[int, ...], ambiguous: bool = False) -> Finding:
    return Finding(category, ranks, WORLD, "summary", ambiguous=ambiguous)


def _truth(cls: str, culprits: list[int], **overrides: object) -> dict[str, object]:
    fc = CLASSES[cls]
    truth: dict[str, object] = {"class": cls, "culprit_ranks": culprits, "accepted": list(fc.accepted),
                                "accepted_with_exits": list(fc.with_exits or fc.accepted),
                                "accepted_without_stacks": list(fc.no_stacks_accepted),
                                "undecidable": dict(fc.undecidable)}
    truth.update(overrides)
    return truth


def test_the_same_seed_draws_the_same_jobs_and_every_draw_is_runnable() -> None:
    classes = list(CLASSES)
    first = draw_jobs(2313, 3 * len(classes), classes, ["2.13", "2.15"])
    again = draw_jobs(2313, 3 * len(classes), classes, ["2.13", "2.15"])
    assert [j.to_json() for j in first] == [j.to_json() for j in again]
    assert {j.cls for j in first} == set(classes)
    for job in first:
        fc = CLASSES[job.cls]
        assert fc.min_world <= job.world <= fc.max_world, job.job_id
        assert job.layout in fc.layouts, job.job_id
        assert len(job.culprits) == (0 if job.cls == "healthy" else fc.culprits), job.job_id
        assert all(0 <= r < job.world for r in job.culprits), job.job_id
        assert 0 < job.fault_step < job.steps - 1 or job.fault_step == 1, job.job_id
        assert 0 <= job.op_index < len(job.params["ops"]), job.job_id
        members = [set(ranks) for _, _, ranks in groups_of(job)]
        assert all(any(r in m for m in members[1:]) for r in range(job.world)) or len(members) == 1, job.job_id
        if job.cls == "pipeline":
            assert 0 < job.culprits[0] < job.world - 1, "a middle stage: someone waits on each side"
        if job.cls == "a2a":
            assert job.culprits[0] != 0, "rank 0 is the receiver that aborts"
    assert {j.torch for j in first} == {"2.13", "2.15"}


def test_groups_are_named_in_creation_order() -> None:
    spec = JobSpec("x", "hang", 6, "grid", 3, 5, 2, 0, [1], "2.13", 1, 0.0, False,
                   {"ops": [["all_reduce", "tp"]]})
    assert groups_of(spec) == [("0", "default_pg", [0, 1, 2, 3, 4, 5]), ("1", "tp", [0, 1, 2]),
                               ("2", "tp", [3, 4, 5]), ("3", "dp", [0, 3]), ("4", "dp", [1, 4]),
                               ("5", "dp", [2, 5])]


def test_right_means_an_accepted_category_and_exactly_the_culprits() -> None:
    truth = _truth("hang", [2])
    assert judge(_report(_finding(Category.RANK_NOT_JOINED, (2,))), truth, "pickle", False)["right"]
    assert not judge(_report(_finding(Category.RANK_NOT_JOINED, (1, 2))), truth, "pickle", False)["right"]
    assert not judge(_report(_finding(Category.NOT_COMPLETED, (2,))), truth, "pickle", False)["right"]
    assert not judge(_report(), truth, "pickle", False)["right"]
    # only the first finding counts
    later = _report(_finding(Category.RANK_NOT_JOINED, (0,)), _finding(Category.RANK_NOT_JOINED, (2,)))
    assert not judge(later, truth, "pickle", False)["right"]


def test_a_healthy_job_is_right_only_without_findings() -> None:
    truth = _truth("healthy", [])
    assert judge(_report(), truth, "json", False)["right"]
    assert not judge(_report(_finding(Category.STRAGGLER, (1,))), truth, "json", False)["right"]


def test_ambiguous_counts_when_its_candidates_hold_the_culprits_and_are_at_most_twice_as_many() -> None:
    # The project's judge (../shared/accuracy-dev/score.py) rules so in every form.
    truth = _truth("pipeline", [2])
    candidates = _report(_finding(Category.RANK_NOT_JOINED, (2, 3), ambiguous=True))
    assert judge(candidates, truth, "pickle", False)["right"], "no stacks: p2p cannot be seen"
    assert judge(candidates, truth, "snapshot", False)["right"]
    three = _report(_finding(Category.RANK_NOT_JOINED, (1, 2, 3), ambiguous=True))
    assert not judge(three, truth, "pickle", False)["right"]
    missing_culprit = _report(_finding(Category.RANK_NOT_JOINED, (1, 3), ambiguous=True))
    assert not judge(missing_culprit, truth, "pickle", False)["right"]


def test_exit_codes_narrow_what_is_right() -> None:
    truth = _truth("crash", [3])
    not_joined = _report(_finding(Category.RANK_NOT_JOINED, (3,)))
    assert judge(not_joined, truth, "pickle", False)["right"]
    assert not judge(not_joined, truth, "pickle", True)["right"], "with exit codes the crash must be named"
    assert judge(_report(_finding(Category.RANK_STOPPED, (3,))), truth, "pickle", True)["right"]


def test_a_two_rank_mismatch_is_undecidable() -> None:
    spec = JobSpec("x", "type", 4, "grid", 2, 5, 2, 0, [1], "2.13", 1, 0.0, False,
                   {"ops": [["all_reduce", "tp"], ["all_reduce", "dp"], ["all_reduce", "world"]]})
    assert set(truth_of(spec)["undecidable"]) == {"snapshot", "pickle", "json"}
    spec.op_index = 2
    assert truth_of(spec)["undecidable"] == {}


def test_a_stale_dump_is_undecidable_only_in_copied_files_without_exit_codes() -> None:
    """The stale rank named as not joined is right only where its read time is lost (copied files) and
    no exit code is passed; the crash must be named wherever the evidence can decide."""
    ops = {"ops": [["all_reduce", "world"]]}
    copied = JobSpec("x", "stale", 4, "default", 0, 7, 3, 0, [2], "2.13", 1, 8.0, False, ops)
    truth = truth_of(copied)
    assert set(truth["undecidable"]) == {"pickle", "json"}
    not_joined = _report(_finding(Category.RANK_NOT_JOINED, (2,)))
    verdict = judge(not_joined, truth, "pickle", False)
    assert verdict["right"] and verdict["undecidable"]
    assert not judge(not_joined, truth, "snapshot", False)["right"], "the snapshot keeps its read time"
    assert not judge(_report(_finding(Category.RANK_NOT_JOINED, (1,))), truth, "pickle", False)["right"]
    for spec in (JobSpec("x", "stale", 4, "default", 0, 7, 3, 0, [2], "2.13", 1, 0.0, False, ops),
                 JobSpec("x", "stale", 4, "default", 0, 7, 3, 0, [2], "2.13", 1, 8.0, True, ops)):
        assert truth_of(spec)["undecidable"] == {}
        assert not judge(not_joined, truth_of(spec), "pickle", spec.exits)["right"]


def test_a_miss_in_an_undecidable_form_is_flagged_apart_from_the_others() -> None:
    truth = _truth("pipeline", [2])
    assert judge(_report(), truth, "pickle", False) == {
        "right": False, "got": "no finding", "category": None, "ranks": [], "ambiguous": False, "undecidable": True}
    assert "undecidable" not in judge(_report(), truth, "snapshot", False)


def test_torchfrtrace_output_is_read_as_its_first_verdict() -> None:
    text = "\n".join([
        "Collective sequence number: 2 has errors",
        "error msg: Culprit rank 2; Error type: COLLECTIVE_TYPE_MISMATCH, Expected collective type: 'all_reduce'",
        "Not all ranks joining collective, sequence number: 2",
        "missing ranks: {0, 2}",
    ])
    assert parse_torchfrtrace(text) == ("CollectiveTypeMismatch", [2])
    assert parse_torchfrtrace("Not all ranks joining collective\nmissing ranks: {1, 3}\n") == ("RankNotJoined", [1, 3])
    assert parse_torchfrtrace("No errors found for this collective entry\n") == (None, [])
