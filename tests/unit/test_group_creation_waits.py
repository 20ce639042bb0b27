"""Issue 33's principle 1 where a wait shows only in a stack: creating a process group (`new_group`,
`new_subgroups`) is collective too, its ranks meet in the store, and the recorder keeps nothing of it. A
rank whose stack is inside one waits for the ranks that have not come to create it; it is no sink, and a
rank in Python that never came is where the waits end. The stacks are faulthandler's text as torch's
worker server returns it (the store wait innermost); the recorders are gloo-shaped."""

from __future__ import annotations

from frscope.analysis import Category
from tests.unit.test_barrier_waits import _capture, _gloo  # gloo-shaped recorders, captured as snapshot pieces
from tests.unit.test_unrecorded_waits import SITE, _stack  # faulthandler's text, as the worker server returns it

C10D = f"{SITE}/distributed_c10d.py"
CREATING = _stack(("_new_process_group_helper", C10D, 2169), ("_new_group_with_tag", C10D, 6056),
                  ("new_group", C10D, 5863), ("wrapper", f"{SITE}/c10d_logger.py", 83),
                  ("build_eval_group", "/app/train.py", 88), ("main", "/app/train.py", 166))
SUBGROUPS = _stack(("_store_based_barrier", C10D, 4661), ("_new_group_with_tag", C10D, 6056),
                   ("new_group", C10D, 5863), ("new_subgroups", C10D, 6214), ("main", "/app/train.py", 150))
IN_COLLECTIVE = _stack(("all_reduce", C10D, 3252), ("wrapper", f"{SITE}/c10d_logger.py", 83),
                       ("train_step", "/app/train.py", 134), ("main", "/app/train.py", 166))
IN_PYTHON = _stack(("load_eval_set", "/app/train.py", 177), ("main", "/app/train.py", 163))


def test_ranks_creating_a_group_wait_for_the_rank_in_python_that_never_came() -> None:
    # Every recorder idle after #10; ranks 0, 2, 3, 4 are inside new_group, rank 1 sits in Python.
    done = [_gloo(s) for s in range(1, 11)]
    stacks = {r: CREATING for r in (0, 2, 3, 4)} | {1: IN_PYTHON}
    report = _capture({r: list(done) for r in range(5)}, stacks)
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (1,), first.summary
    assert "new_group" in first.summary


def test_a_store_wait_inside_new_subgroups_reads_as_creating_a_group() -> None:
    done = [_gloo(s) for s in range(1, 11)]
    stacks = {r: SUBGROUPS for r in (0, 1, 3)} | {2: IN_PYTHON}
    first = _capture({r: list(done) for r in range(4)}, stacks).findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (2,), first.summary


def test_every_rank_creating_a_group_together_is_no_finding() -> None:
    # Nobody is in Python or missing: whatever holds them, no rank is the one that never came.
    done = [_gloo(s) for s in range(1, 11)]
    report = _capture({r: list(done) for r in range(4)}, dict.fromkeys(range(4), CREATING))
    assert not [f for f in report.findings if f.category is Category.RANK_NOT_JOINED], \
        [f.summary for f in report.findings]


def test_a_rank_creating_a_group_is_no_sink_where_the_others_wait_in_a_collective_it_skipped() -> None:
    # Rank 3 went on to create a group; the others wait in all_reduce #11, which it never entered. It is the
    # one that left the common order (the others' waits end at it), not a rank idle "in Python".
    done = [_gloo(s) for s in range(1, 11)]
    recorders = {r: [*done, _gloo(11, done=False)] for r in (0, 1, 2)}
    recorders[3] = list(done)
    stacks = {r: IN_COLLECTIVE for r in (0, 1, 2)} | {3: CREATING}
    first = _capture(recorders, stacks).findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (3,), first.summary
