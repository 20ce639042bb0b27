"""What the node ledger trusts: the operator's seal on the reports it publishes (ledger.seal), checked
through the real publisher and the API's round trip; and what a Node says about itself
(ledger.node_signals), from hostile shapes too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from frscope.analysis.suspicion import EvidenceClass
from frscope.operator.kube import KubeClient
from frscope.operator.ledger import LedgerSeal, SignalOptions
from frscope.operator.ledger.node_signals import condition_signal, oom_signal
from frscope.operator.ledger.seal import ANNOTATION
from frscope.operator.model.objects import JobRef
from frscope.operator.publish import Publisher
from tests.unit.operator import builders
from tests.unit.operator.fakes import FakeKube
from tests.unit.operator.test_publisher import publication

SEAL = LedgerSeal(b"s" * 32)


def test_a_seal_survives_the_api_round_trip_and_breaks_on_any_change_the_ledger_reads() -> None:
    body = {"metadata": {"name": "r", "namespace": "ml"}, "job": {"name": "a", "uid": "u", "gatheredAt":
            "2027-01-15T08:00:00Z"}, "diagnosis": {"what": {"category": "NotCompleted"}},
            "impact": {"culpritRanksByNode": {"n2": [3, 1], "n1": [0]}, "watchdogTimeoutSeconds": 600.0}}
    sealed = SEAL.sealed(body)
    assert ANNOTATION not in (body["metadata"].get("annotations") or {})
    back = json.loads(json.dumps(sealed).replace("600.0", "600"))  # numbers and key order as the server has them
    back["impact"]["culpritRanksByNode"] = {"n1": [0], "n2": [1, 3]}
    back["status"] = {"phase": "Done"}  # what the ledger does not read may change
    assert SEAL.verify(back)
    for path, value in ((("impact", "culpritRanksByNode"), {"n9": [0]}), (("diagnosis", "what"),
                        {"category": "Straggler"}), (("metadata", "namespace"), "cv")):
        changed: dict[str, Any] = json.loads(json.dumps(sealed))
        changed[path[0]][path[1]] = value
        assert not SEAL.verify(changed), path
    assert not LedgerSeal(b"t" * 32).verify(sealed)
    assert not SEAL.verify(body)


def test_the_key_comes_from_the_key_file_else_the_ca_key_else_random(tmp_path: Path) -> None:
    key, ca = tmp_path / "key", tmp_path / "tls.key"
    key.write_bytes(b"k" * 40)
    ca.write_bytes(b"-----BEGIN PRIVATE KEY-----" + b"c" * 64)
    body = {"metadata": {"name": "r", "namespace": "ml"}}
    assert LedgerSeal.from_sources(key, ca).sign(body) == LedgerSeal(b"k" * 40).sign(body)
    assert LedgerSeal.from_sources(None, ca).sign(body) == LedgerSeal.from_sources(None, ca).sign(body)
    assert LedgerSeal.from_sources(None, None).sign(body) != LedgerSeal.from_sources(None, None).sign(body)
    key.write_bytes(b"short")
    with pytest.raises(ValueError, match="32 bytes"):
        LedgerSeal.from_sources(key, None)


async def test_the_publisher_seals_the_reports_it_writes(fake_kube: FakeKube, kube_client: KubeClient) -> None:
    stored = fake_kube.put("pytorchjobs", builders.job())
    ref = JobRef("ml", "train", stored["metadata"]["uid"])
    pub = publication(ref)
    await Publisher(kube_client, instance="op-0", seal=SEAL.sealed).publish(pub)
    await Publisher(kube_client, instance="op-0", seal=SEAL.sealed).revise(pub)
    [report] = fake_kube.of("flightrecorderreports")
    assert SEAL.verify(report) and ANNOTATION not in (pub.report_object["metadata"].get("annotations") or {})


def node(*conditions: Any) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": "Ready", "status": "True"}, *conditions]}}


@pytest.mark.parametrize(("obj", "options", "expected"), [
    (node({"type": "KernelDeadlock", "status": "True", "reason": "DockerHung", "message": "task hung"}),
     SignalOptions(), EvidenceClass.HARDWARE_EXIT),
    (node({"type": "GpuXidError", "status": "False"}), SignalOptions(), None),
    (node({"type": "GpuXidError", "status": "True"}), SignalOptions(hardware_conditions=("KernelDeadlock",)), None),
    (node({"type": "DiskPressure", "status": "True"}, {"type": "NetworkUnavailable", "status": "True"}),
     SignalOptions(), None),
    (node({"type": "MemoryPressure", "status": "True"}), SignalOptions(), EvidenceClass.NODE_OOM),
    (node({"type": "MemoryPressure", "status": "True"}, {"type": "GpuXidError", "status": "True"}), SignalOptions(),
     EvidenceClass.HARDWARE_EXIT),
    ({"status": {"conditions": "junk"}}, SignalOptions(), None),
    ({"status": {"conditions": [7, {"type": 3, "status": "True"}]}}, SignalOptions(), None),
])
def test_a_nodes_conditions(obj: dict[str, Any], options: SignalOptions, expected: EvidenceClass | None) -> None:
    said = condition_signal(obj, options)
    assert (said.evidence if said is not None else None) is expected


def test_only_the_kubelets_oom_event_on_that_node_near_the_incident_counts() -> None:
    at = 1_800_000_000.0

    def event(**over: Any) -> dict[str, Any]:
        return {"metadata": {"namespace": "default"}, "reason": "SystemOOM", "source": {"component": "kubelet"},
                "involvedObject": {"kind": "Node", "name": "n1"}, "lastTimestamp": "2027-01-15T08:00:00Z"} | over

    options = SignalOptions(oom_window_s=4e9)  # any time
    assert oom_signal([event()], "n1", at, options) is not None
    for bad in (event(reason="OOMKilling"), event(source={"component": "trainer"}),
                event(metadata={"namespace": "ml"}), event(involvedObject={"kind": "Node", "name": "n2"}),
                event(involvedObject={"kind": "Pod", "name": "n1"}), event(lastTimestamp="junk")):
        assert oom_signal([bad], "n1", at, options) is None, bad
    day_before = event(lastTimestamp="2027-01-14T08:00:00Z")
    assert oom_signal([day_before], "n1", at, SignalOptions(oom_window_s=3600)) is None  # far from the incident
    assert oom_signal([event()], "n1", at, SignalOptions(oom_window_s=3600)) is not None
