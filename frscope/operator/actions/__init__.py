"""Acting on a diagnosis (opt-in; docs/actions.md): restart, stop or cordon, or a dry run that says
what would be done, once per incident, with the GPU time it saves.

    policy   what a job asks for, gated by the verdict and by --allow-actions (pure)
    impact   the watchdog timeout, the job's GPUs, the time saved (pure)
    record   the action record kept in the incident's FlightRecorderReport (the once-only memory)
    jobs     the I/O of restarting and stopping a job as its kind says (jobkinds.JobKind): its pods,
             a TrainJob's JobSet, a Kueue Workload
    cordon   the node taint, its evidence (reports blaming the node) and its budget
    actor    the sequence: read the report, decide, claim, act, record, Event, metrics
"""

from frscope.operator.actions.actor import ActionOptions, Actor
from frscope.operator.actions.cordon import CordonOptions
from frscope.operator.actions.impact import Impact, culprit_placement, job_timeout
from frscope.operator.actions.policy import Policy, parse_allowed, parse_policy
from frscope.operator.actions.record import ActionRecord, restarted_pods, unfinished

__all__ = [
    "ActionOptions",
    "ActionRecord",
    "Actor",
    "CordonOptions",
    "Impact",
    "Policy",
    "culprit_placement",
    "job_timeout",
    "parse_allowed",
    "parse_policy",
    "restarted_pods",
    "unfinished",
]
