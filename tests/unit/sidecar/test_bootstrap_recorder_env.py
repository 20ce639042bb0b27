"""The bootstrap reads the recorder's settings as torch does: each TORCH_FR_* name before its old TORCH_NCCL_*
alias, else torch's default; a buffer of 0 (the recorder off) is said on stderr. The bootstrap file runs in
the user's image without frscope, so it is loaded here from its path, as Python's `site` loads it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

import frscope.sidecar.bootstrap as bootstrap_package


def _bootstrap() -> ModuleType:
    path = Path(bootstrap_package.__file__).with_name("sitecustomize.py")
    spec = importlib.util.spec_from_file_location("frscope_bootstrap_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bootstrap() -> ModuleType:
    return _bootstrap()


def test_the_new_names_win_over_the_old_ones_as_in_torch(bootstrap: ModuleType) -> None:
    env = {"TORCH_FR_BUFFER_SIZE": "4000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/dumps/nccl_trace_rank_", "TORCH_FR_DUMP_ON_TIMEOUT": "1"}
    assert bootstrap._recorder_settings(env) == {
        "buffer_size": {"value": "4000", "from": "TORCH_FR_BUFFER_SIZE"},
        "dump_prefix": {"value": "/dumps/nccl_trace_rank_", "from": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"},
        "dump_on_timeout": {"value": "1", "from": "TORCH_FR_DUMP_ON_TIMEOUT"},
    }
    assert bootstrap._recorder_settings({})["buffer_size"] == {"value": "2000", "from": "default"}


@pytest.mark.parametrize("name", ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"])
def test_a_recorder_switched_off_under_either_name_is_said_and_noted(
        bootstrap: ModuleType, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    monkeypatch.setenv(name, "0")
    bootstrap._write_meta(str(tmp_path), 3, str(tmp_path / "rank-3.sock"))
    assert f"{name}=0: torch's Flight Recorder is off" in capsys.readouterr().err
    meta = json.loads((tmp_path / ".rank-3.json").read_text())
    assert meta["recorder"]["buffer_size"] == {"value": "0", "from": name}
    assert not bootstrap._recorder_off(bootstrap._recorder_settings({name: "2000"}))
