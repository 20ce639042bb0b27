"""The live page shows each rank's own duration of each collective on gloo, in a real Chromium: a healthy
real torchrun job (2 ranks, frscope/testing/timed_train.py) with frscope's zero-code bootstrap (whose
collective timer dates what gloo's recorder does not), a real `frscope sidecar`, the operator's web UI.
torch 2.13, the test venv's (tests/integration/test_live_durations.py covers 2.14 and 2.15 too)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from frscope.demo.live import LocalSidecar
from frscope.operator.model.objects import JobRef, PodInfo
from frscope.operator.model.store import JobStore
from tests.browser.conftest import LiveServer, PageErrors, wait_ready
from tests.integration.test_bootstrap_launchers import Pod, launched
from tests.integration.test_live_durations import TRAIN, WORLD, _ui

pytestmark = [pytest.mark.browser, pytest.mark.torch]


@pytest.mark.timeout(240)
def test_the_live_page_shows_each_ranks_duration_of_each_collective(browser: Any, tmp_path: Path,
                                                                   artifacts: Path) -> None:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
            str(TRAIN), "--seconds", "120", "--pause", "0.02"]
    with launched([Pod("host", argv, {}, tuple(range(WORLD)))], tmp_path) as running:
        sockets = running[0].socket_dir
        deadline = time.monotonic() + 150
        while len(list(sockets.glob("rank-*.sock"))) < WORLD:
            assert running[0].proc.poll() is None and time.monotonic() < deadline, running[0].log.read_text()[-3000:]
            time.sleep(0.1)
        sidecar = LocalSidecar(sockets, stall_after_s=60.0)
        try:
            sidecar.wait_listening(time.monotonic() + 60)
            store = JobStore()
            store.upsert_job(JobRef("ml", "train", "uid-train"), world_size=WORLD,
                             conditions=[{"type": "Running", "status": "True"}])
            store.upsert_pod(PodInfo("ml", "train-master-0", "uid-pod", "train", "Master", 0, "127.0.0.1",
                                     sidecar.port, "Running", 0, (), False))
            with LiveServer(_ui(store)) as server:
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = context.new_page()
                errors = PageErrors(page)
                try:
                    page.goto(f"http://127.0.0.1:{server.port}/jobs/ml/train")
                    wait_ready(page)
                    page.wait_for_function("() => window.frscope.state().cols > 6", timeout=90_000)

                    def timed_seq() -> int | None:
                        seqs = page.evaluate("() => window.frscope.list().seqs")
                        for seq in reversed(seqs[:-2]):
                            cells = [page.evaluate(f"() => window.frscope.cellAt({r}, {seq})") for r in range(WORLD)]
                            if all(c and c["op"] == "all_reduce" and (c.get("own_duration_ms") or 0) > 0
                                   for c in cells):
                                return int(seq)
                        return None

                    found = None
                    until = time.monotonic() + 30
                    while found is None and time.monotonic() < until:
                        found = timed_seq()
                        if found is None:
                            time.sleep(1)
                    assert found is not None, "no all_reduce with each rank's own duration on the page"
                    for rank in range(WORLD):
                        info = page.evaluate(f"() => window.frscope.cellAt({rank}, {found})")
                        assert 0 < info["own_duration_ms"] < 60_000, info
                        assert info["own_started_ms"] is not None, info
                    page.screenshot(path=str(artifacts / "live-window-durations.png"), full_page=True)
                    assert errors.items == []
                finally:
                    context.close()
        finally:
            sidecar.stop()
