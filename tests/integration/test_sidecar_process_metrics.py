"""`frscope sidecar` as the image runs it (its own process, entry point and all): its /metrics has no
`<metric>_created` series. prometheus_client adds one per counter, histogram and labelled child unless told
not to: 20 of them on an idle sidecar, one per rank and group more on a busy one, read by no rule or panel."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)


def test_the_sidecar_process_exports_no_created_series(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    log = (tmp_path / "sidecar.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "frscope", "sidecar", "--socket-dir", str(tmp_path), "--port", "0",
         "--host", "127.0.0.1", "--port-file", str(port_file), "--evidence-dir", "none", "--pod", "p",
         "--namespace", "ml"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 40
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert proc.poll() is None, (tmp_path / "sidecar.log").read_text()
            assert time.monotonic() < deadline, "the sidecar never wrote its port"
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port_file.read_text().strip()}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        counters = [line for line in text.splitlines() if line.startswith("# TYPE frscope_")
                    and line.endswith((" counter", " histogram"))]
        assert counters, text  # there are counters and histograms, which would have had `_created`
        created = [line for line in text.splitlines() if not line.startswith("#") and "_created" in line]
        assert not created, created
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
