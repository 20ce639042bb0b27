"""The operator's vocabulary of watched things: the job kinds (`jobkinds`), typed views of jobs and pods
(`objects`), the signals they raise (`signals`), incidents and their records (`incidents`), the in-memory
job store the web UI reads (`store`), and the operator's Prometheus metrics (`operator_metrics`)."""
