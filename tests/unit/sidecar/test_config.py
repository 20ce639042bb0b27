"""`frscope sidecar` options: flags win over FRSCOPE_* variables, which win over defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from frscope.cli import build_parser
from frscope.sidecar.config import MiB, SidecarConfig, config_from_args, parse_size


def parse(argv: list[str]) -> SidecarConfig:
    args = build_parser("sidecar").parse_args(["sidecar", *argv])
    return config_from_args(args)


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("POD_NAME", "HOSTNAME", "POD_NAMESPACE", "NODE_NAME"):
        monkeypatch.delenv(var, raising=False)
    cfg = parse([])
    assert cfg.socket_dir == Path("/run/frscope")
    assert cfg.evidence_dir == Path("/run/frscope/evidence")
    assert cfg.dump_dir is None and cfg.token_file is None and cfg.operator_url is None
    assert (cfg.port, cfg.poll_interval_s, cfg.stall_after_s) == (9402, 2.0, 60.0)
    # A full recorder every 30 s, a probe every 2 s; suspected after 4-15 s by the group's rhythm.
    assert (cfg.full_poll_every, cfg.suspect_min_s, cfg.suspect_after_s) == (15, 4.0, 15.0)
    assert cfg.straggler_min_share == 0.1
    assert cfg.pod  # the host name


def test_env_then_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FRSCOPE_SOCKET_DIR", str(tmp_path))
    monkeypatch.setenv("FRSCOPE_POLL_INTERVAL", "2.5")
    monkeypatch.setenv("FRSCOPE_MAX_ANSWER_BYTES", "8M")
    monkeypatch.setenv("FRSCOPE_EVIDENCE_DIR", "none")
    monkeypatch.setenv("POD_NAME", "trainer-worker-3")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    cfg = parse(["--poll-interval", "1", "--stall-after=30"])
    assert cfg.socket_dir == tmp_path
    assert cfg.poll_interval_s == 1.0 and cfg.stall_after_s == 30.0
    assert cfg.max_answer_bytes == 8 * MiB
    assert cfg.evidence_dir is None
    assert (cfg.pod, cfg.namespace) == ("trainer-worker-3", "ml")


def test_bad_values_are_usage_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRSCOPE_STALL_AFTER", "soon")
    with pytest.raises(ValueError, match="FRSCOPE_STALL_AFTER"):
        parse([])
    monkeypatch.delenv("FRSCOPE_STALL_AFTER")
    with pytest.raises(ValueError, match="poll-interval"):
        parse(["--poll-interval", "0"])
    for share in ("0", "1.5"):
        with pytest.raises(ValueError, match="straggler-min-share"):
            parse(["--straggler-min-share", share])
    monkeypatch.setenv("FRSCOPE_STRAGGLER_MIN_SHARE", "0.3")
    assert parse([]).straggler_min_share == 0.3
    assert parse([]).metrics_detail == "pod"
    with pytest.raises(ValueError, match="--metrics-detail 'rank'"):
        parse(["--metrics-detail", "rank"])
    monkeypatch.setenv("FRSCOPE_METRICS_DETAIL", "rank-group")
    assert parse([]).metrics_detail == "rank-group"


def test_print_pythonpath(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser("sidecar").parse_args(["sidecar", "print-pythonpath"])
    assert args.func(args) == 0
    out = Path(capsys.readouterr().out.strip())
    assert (out / "sitecustomize.py").is_file()


def test_usage_error_exit_code(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    args: argparse.Namespace = build_parser("sidecar").parse_args(["sidecar", "--stall-timeout-fraction", "2"])
    assert args.func(args) == 2
    assert "stall-timeout-fraction" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "value"), [("512", 512), ("4k", 4096), ("64M", 64 * MiB), ("1GiB", 1024 * MiB)])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_tls_options_go_together() -> None:
    with pytest.raises(ValueError, match="--certificate-url needs --operator-identity"):
        SidecarConfig(certificate_url="http://operator", pod="p", namespace="n")
    with pytest.raises(ValueError, match="go together"):
        SidecarConfig(tls_cert_file=Path("tls.crt"))
    with pytest.raises(ValueError, match="exclude each other"):
        SidecarConfig(certificate_url="http://operator", tls_cert_file=Path("a"), tls_key_file=Path("b"),
                      operator_identity="system:serviceaccount:a:b", pod="p", namespace="n")
