"""The operator's logic between its inputs (`serve`) and its outputs (`publish`, `actions`): the settings,
and the controller that queues each job's signals, dedupes its incidents, and runs them."""
