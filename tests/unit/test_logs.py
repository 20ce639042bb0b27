"""One --log-level casing and --log-format json (job, namespace, pod, incident as fields) for the
operator and the sidecar; `frscope operator --help` names every flag's variable and default."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frscope import logs
from frscope.cli import build_parser, main
from frscope.operator.command import from_args


def _operator_args(*argv: str, env: dict[str, str] | None = None) -> object:
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        return build_parser("operator").parse_args(["operator", *argv])
    finally:
        os.environ.clear()
        os.environ.update(old)


def test_operator_help_names_every_variable_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["operator", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    flags = [a for a in build_parser("operator")._subparsers._group_actions[0].choices["operator"]._actions
             if a.option_strings and a.help != "==SUPPRESS==" and a.dest != "help"]
    assert len(flags) > 20
    for action in flags:
        var = "FRSCOPE_WATCH_NAMESPACES" if action.dest == "namespaces" else \
            "FRSCOPE_" + action.option_strings[0].lstrip("-").upper().replace("-", "_")
        assert f"[env {var}" in text, action.option_strings
    assert "--stall-after" not in text.split("--stuck-after", 1)[0]  # the old name is hidden
    assert "default 10.0" in text.split("--stuck-after", 1)[1]


def test_operator_flags_env_and_the_old_threshold_name() -> None:
    config = from_args(_operator_args(env={"FRSCOPE_STUCK_AFTER": "3", "FRSCOPE_LOG_FORMAT": "JSON",
                                           "FRSCOPE_WATCH_NAMESPACES": "a, b"}), env={})
    assert config.stuck_after_s == 3.0 and config.log_format == "json" and config.namespaces == ("a", "b")
    assert from_args(_operator_args("--stuck-after", "5", env={"FRSCOPE_STUCK_AFTER": "3"}), env={}).stuck_after_s == 5
    assert from_args(_operator_args("--stall-after", "7"), env={}).stuck_after_s == 7  # deprecated alias
    assert from_args(_operator_args("--log-level", "DEBUG"), env={}).log_level == "debug"
    with pytest.raises(SystemExit):
        _operator_args("--log-level", "loud")


def test_operator_leader_election_flags() -> None:
    assert from_args(_operator_args(), env={"POD_NAMESPACE": "ops"}).leader_election is None  # alone by default
    election = from_args(_operator_args("--leader-election-lease", "frscope", "--lease-duration", "20"),
                         env={"POD_NAMESPACE": "ops", "POD_NAME": "frscope-7d-x"}).leader_election
    assert election is not None and (election.lease, election.namespace, election.pod) == ("frscope", "ops",
                                                                                         "frscope-7d-x")
    assert (election.duration_s, election.renew_deadline_s, election.retry_period_s) == (20, 10, 2)
    assert election.identity.startswith("frscope-7d-x_")  # a restarted container is a new candidate
    with pytest.raises(ValueError, match="needs --leader-election-namespace"):
        from_args(_operator_args("--leader-election-lease", "frscope"), env={})
    with pytest.raises(ValueError, match="must exceed the renew deadline"):
        from_args(_operator_args("--leader-election-lease", "frscope", "--lease-duration", "10"),
                  env={"POD_NAMESPACE": "ops"})


def test_json_lines_lift_job_namespace_pod_and_incident(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup("info", "json", {"pod": "trainer-0"})
    try:
        logging.getLogger("frscope.test").warning("job %s: stuck", "ml/train",
                                                  extra=logs.fields(job="train", namespace="ml", incident="ab12"))
        logging.getLogger("kopf.objects").info("Handler succeeded",
                                               extra={"k8s_ref": {"kind": "Pod", "name": "w-1", "namespace": "ml"}})
    finally:
        logs.setup("info", "text")
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert first["message"] == "job ml/train: stuck" and first["level"] == "warning"
    assert (first["job"], first["namespace"], first["incident"], first["pod"]) == ("train", "ml", "ab12", "trainer-0")
    assert (second["pod"], second["namespace"], second["logger"]) == ("w-1", "ml", "kopf.objects")


def test_a_real_sidecar_logs_json_with_its_pod(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    env = dict(os.environ, POD_NAME="trainer-worker-3", POD_NAMESPACE="ml")
    proc = subprocess.Popen(
        [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(tmp_path), "--host", "127.0.0.1",
         "--port", "0", "--port-file", str(port_file), "--evidence-dir", "none", "--log-format", "json",
         "--log-level", "INFO"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    lines = [json.loads(line) for line in err.decode().splitlines() if line.strip()]
    listening = [x for x in lines if "listening" in x["message"]]
    assert listening, err.decode()
    assert all(x["pod"] == "trainer-worker-3" and x["namespace"] == "ml" for x in lines)
