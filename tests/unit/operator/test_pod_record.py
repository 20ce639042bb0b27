"""The record the operator keeps of each watched pod (`objects.pod_info`): every field it reads of a pod
survives, nothing else of the object is kept, and what anyone with `pods/status` may write is bounded.

The pods are the JSON an API server sends (builders.pod, with the extra fields a real one carries:
managedFields, annotations, volumes), decoded as the watch decodes them."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from frscope.operator import names
from frscope.operator.model.objects import (
    GPU_RESOURCES,
    MAX_CONTAINERS,
    MAX_MESSAGE,
    MAX_SHORT,
    WATCHDOG_TIMEOUT_ENV,
    PodInfo,
    Termination,
    pod_info,
)
from tests.unit.operator import builders


def wire(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as a watch event's object arrives: serialized and parsed again (fresh strings)."""
    decoded = json.loads(json.dumps({"type": "MODIFIED", "object": pod}))["object"]
    assert isinstance(decoded, dict)
    return decoded


def full_pod() -> dict[str, Any]:
    crash = builders.terminated(builders.WATCHDOG_MESSAGE, code=6)
    pod = builders.pod("train-worker-3", index=3, ip="10.0.3.7", port=9402, restarts=2,
                       state={"running": {"startedAt": "2026-01-01T00:02:00Z"}}, last_state=crash)
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:03:00Z"
    pod["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {"x" * 50: {}}}}] * 20
    pod["metadata"]["annotations"] = {"example.com/big": "y" * 10_000}
    pod["spec"]["nodeName"] = "gpu-node-7"
    pod["spec"]["volumes"] = [{"name": f"v{i}", "emptyDir": {}} for i in range(50)]
    trainer = pod["spec"]["containers"][0]
    trainer["resources"] = {"limits": {GPU_RESOURCES[0]: "8"}}
    trainer["env"] = [{"name": WATCHDOG_TIMEOUT_ENV, "value": "600"}, {"name": "PET_NNODES", "value": "4"},
                      {"name": "PET_NPROC_PER_NODE", "value": "8"}]
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["finishedAt"] = "2026-01-01T00:01:30Z"
    return pod


def test_every_field_the_operator_reads_survives_the_wire() -> None:
    info = pod_info(wire(full_pod()))
    assert (info.namespace, info.name, info.uid) == ("ml", "train-worker-3", "uid-train-worker-3")
    assert (info.job_name, info.replica_type, info.replica_index) == ("train", "worker", 3)
    assert info.endpoint == "http://10.0.3.7:9402" and info.sidecar_port == 9402
    assert (info.phase, info.run, info.deleting, info.node) == ("Running", 2, True, "gpu-node-7")
    assert (info.gpus, info.env_timeout_s, info.world_size_hint) == (8, 600.0, 32)
    assert info.terminations == (Termination("pytorch", 1, 6, "Error", builders.WATCHDOG_MESSAGE,
                                             finished_at_ns=1_767_225_690 * 1_000_000_000),)


def test_the_record_holds_no_part_of_the_raw_object() -> None:
    """Only scalars and Termination records: no dict or list of the event stays alive through it."""
    info = pod_info(wire(full_pod()))

    def scalars(value: Any) -> bool:
        if isinstance(value, tuple):
            return all(scalars(v) for v in value)
        if isinstance(value, Termination):
            return all(scalars(getattr(value, f.name)) for f in dataclasses.fields(value))
        return value is None or isinstance(value, (str, int, float, bool))

    assert all(scalars(getattr(info, f.name)) for f in dataclasses.fields(PodInfo))
    assert not hasattr(info, "__dict__")  # slots: no room for anything else


def test_strings_many_pods_share_are_shared() -> None:
    """32,768 pods of one job: one 'ml', one 'train', one 'Running' (interned), not one each."""
    first, second = (pod_info(wire(builders.pod(f"train-worker-{i}", index=i))) for i in range(2))
    for field in ("namespace", "job_name", "phase", "node", "replica_type"):
        assert getattr(first, field) is getattr(second, field), field
    assert first.namespace is sys.intern("ml")


def test_hostile_status_fields_are_bounded() -> None:
    """A status written through `pods/status` (not by a kubelet): a 1 MiB termination message, a long
    reason, thousands of container statuses. The record keeps a bounded amount of each; the message
    keeps its tail, where a watchdog's line is."""
    pod = builders.pod("train-worker-0", state=builders.terminated("x" * (1 << 20) + builders.WATCHDOG_MESSAGE))
    statuses = pod["status"]["containerStatuses"]
    statuses[0]["state"]["terminated"]["reason"] = "R" * 100_000
    statuses[0]["name"] = names.TRAINER_CONTAINER
    statuses += [{"name": f"extra-{i}", "restartCount": 0, "state": builders.terminated("boom", 1)}
                 for i in range(5_000)]
    info = pod_info(wire(pod))
    [term] = info.terminations  # the trainer's: the others are not trainers, and past MAX_CONTAINERS anyway
    assert len(term.message) == MAX_MESSAGE and term.message.endswith(builders.WATCHDOG_MESSAGE)
    assert len(term.reason) == MAX_SHORT

    del statuses[0]  # no trainer container: every other one counts, up to MAX_CONTAINERS of them
    assert len(pod_info(wire(pod)).terminations) == MAX_CONTAINERS


def test_unknown_and_wrongly_typed_fields_give_a_record_not_an_error() -> None:
    pod = builders.pod("train-worker-0")
    pod["status"] = {"phase": ["not", "a", "string"] * 1000, "podIP": {"x": 1}, "containerStatuses": "nope",
                     "unknownField": {"deep": [1] * 1000}}
    pod["spec"]["containers"] = [{"name": "pytorch", "ports": "nope", "env": [None, 3]}]
    info = pod_info(wire(pod))
    assert info.terminations == () and info.run == 0 and info.ip is None and info.endpoint is None
    assert len(info.phase) <= MAX_SHORT
