"""Random programs with a discrete-event executor: a generator of distributed jobs (groups, per-rank
programs, one fault) whose Flight Recorder dumps, stacks and exit codes come from simulating gloo's or
NCCL's semantics, and whose truth comes from the executor's final wait-for state. No torch: thousands of
programs a minute. `python -m frscope.testing.randprog sweep|replay` (docs/accuracy.md)."""
