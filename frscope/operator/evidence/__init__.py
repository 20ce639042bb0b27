"""What the operator knows of a job's ranks: the sidecars' HTTP client, each pod's snapshot decoded
(`pod_evidence`), the gather fan-out, pushed snapshots (`push_store`, spilled to disk by `spill`), how the
trainer containers ended (`trainer_exits`), and the analysis of all of it (`diagnosis`). It knows
nothing of what is done with a diagnosis (`publish`, `actions`)."""
