"""What faces the outside: kopf's handlers and login, the operator's HTTP server (probes, /metrics,
/v1/push behind its gate and its callers' identity check), the web UI's mount, and the status sweep
over the sidecars. Everything here turns what it receives into calls on `engine`."""
