"""Generators for tests and benchmarks (synthetic dumps, real-torch fault sweeps).

Never imported by runtime code: an import-linter contract keeps the sidecar, the operator, the CLI's
analysis path, `records`, `analysis`, `report` and `webui` from reaching it.
"""
