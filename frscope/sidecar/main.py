"""`frscope sidecar`: argument wiring and the process lifecycle (SIGTERM: clean shutdown, exit 0).

Importing this module is cheap (no aiohttp): `frscope analyze` builds its parser from here too.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from frscope import logs
from frscope.sidecar.bootstrap import BOOTSTRAP_DIR, install
from frscope.sidecar.config import SidecarConfig, add_arguments, config_from_args

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("frscope.sidecar")

WORKER_THREADS = 4
BACKGROUND_NICE = 10

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `frscope sidecar` to the CLI's subparsers."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "sidecar",
        help="collect every local rank's Flight Recorder, detect stalls, serve /metrics and the API",
        description=(
            "Runs beside a training container (docs/sidecar.md). Every option also reads an FRSCOPE_* "
            "environment variable; a flag wins. 'print-pythonpath' prints the directory of the "
            "sitecustomize bootstrap to put on the trainer's PYTHONPATH."
        ),
    )
    parser.add_argument("action", nargs="?", choices=("run", "print-pythonpath"), default="run")
    add_arguments(parser)
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    if args.action == "print-pythonpath":
        print(BOOTSTRAP_DIR)
        return EXIT_OK
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"frscope sidecar: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # JSON lines name the sidecar's pod and namespace (the ones it was given or found).
    logs.setup(args.log_level, args.log_format, {"pod": config.pod, "namespace": config.namespace})
    if config.install_bootstrap is not None:
        try:
            for path in install(config.install_bootstrap):
                log.info("bootstrap installed: %s", path)
        except OSError as exc:
            print(f"frscope sidecar: --install-bootstrap {config.install_bootstrap}: {exc}", file=sys.stderr)
            return EXIT_FAILED
    # Parsing threads give the event loop the GIL back within 2 ms (default 5 ms): /metrics stays fast.
    sys.setswitchinterval(0.002)
    # No `<counter>_created` series: one more per labelled child (per rank and group) that no rule or panel
    # reads, about a quarter of a pod's series.
    import prometheus_client

    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    return asyncio.run(serve(config, own_executor=True))


def _background() -> None:
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE))
    except (OSError, AttributeError):  # not Linux, or not allowed: run at the normal priority
        pass


async def serve(config: SidecarConfig, registry: CollectorRegistry | None = None,
                stop: asyncio.Event | None = None, *, own_executor: bool = False) -> int:
    """Run until `stop` is set, or SIGTERM/SIGINT arrives; then shut down cleanly. `own_executor`:
    the process is the sidecar's own (`frscope sidecar`), so the loop's thread pool can be set up."""
    from frscope.sidecar.app import Sidecar

    sidecar = Sidecar(config, registry)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if own_executor:
        # Parsing and compression run in these threads: few of them (bounded memory), and at a lower
        # CPU priority than the event loop and the training processes beside the sidecar.
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="frscope", initializer=_background)
        )
    handled: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    try:
        try:
            await sidecar.start()
        except ValueError as exc:
            log.error("%s", exc)
            await sidecar.stop()
            return EXIT_USAGE
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", config.host, config.port, exc.strerror or exc)
            await sidecar.stop()
            return EXIT_FAILED
        await stop.wait()
        log.info("shutting down")
        await sidecar.stop()
        return EXIT_OK
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
