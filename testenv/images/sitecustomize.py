# The trainer image's own sitecustomize: leaves a mark the tests read back (an environment variable the
# training script prints, so the pod's log shows it ran).
import os

os.environ["TRAINER_SITECUSTOMIZE"] = "ran"
