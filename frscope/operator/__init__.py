"""frscope's Kubernetes operator: watches PyTorchJobs and their pods, gathers every rank's recorder
from the sidecars when a job hangs, analyzes it with frscope.analysis, and writes the diagnosis into
the job (condition, Events, FlightRecorderReport). See docs/operator.md.

Layers, bottom up: `names`, `objects` (typed views of watched objects), `kube` (API client, typed
errors, retries), `sidecars`/`gather`/`push` (evidence), `diagnose`, `incidents` (dedupe),
`publish` (condition, Events, report object), `controller` (the logic), `poller`, `http`,
`webhook`, `handlers` (kopf), `runner` (wiring), `command` (CLI).

For the web UI: `store.JobsView` (read-only jobs and their latest diagnosis) and
`http.OperatorHttp.add_routes()`; `runner.serve(..., mount=...)` hands both over before start.
"""
