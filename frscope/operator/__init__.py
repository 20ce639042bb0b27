"""frscope's Kubernetes operator: watches PyTorchJobs and their pods, gathers every rank's recorder
from the sidecars when a job hangs, analyzes it with frscope.analysis, and writes the diagnosis into
the job (condition, Events, FlightRecorderReport). See docs/operator.md.

Layers, top down (each imports only those below it; the contract is in pyproject.toml): `command` (CLI),
`runner` (wiring), `serve` (kopf handlers, HTTP, web UI, status sweep), `engine` (settings, controller),
`actions` | `injection`, `publish`, `evidence` (sidecars, gather, pushes, exits, diagnosis), `model`
(job kinds, objects, signals, incidents, store, metrics), `kube` (API client), `names`.

For the web UI: `model.store.JobsView` (read-only jobs and their latest diagnosis) and
`serve.operator_http.OperatorHttp.add_routes()`; `runner.serve(..., mount=...)` hands both over before start.
"""
