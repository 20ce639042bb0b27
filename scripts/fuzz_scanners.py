"""Fuzz the C dump scanners against the pure-Python path (frscope.testing.scanfuzz), for a while.

Each target (pickle: torch's pickle dumps, `_frscan.scan`; json: JSON dumps and snapshot pieces,
`_frscan.scan_json`; envelope: sidecar snapshot bodies as the operator decodes them, `_frscan.scan_envelope`
and `scan_piece`) runs in a child process that mutates real dumps and checks each input: the scanner's
reading equals the reference's, nothing but the typed errors escapes, no input takes more than --slow
seconds. The input being checked is written to OUT/<target>.current first: when a child dies (a crash, a
sanitizer report) or stops making progress (--hang seconds), the parent keeps that input under OUT/crash/
with the child's last output, and starts another child. Other findings go to OUT/findings.jsonl and their
inputs to OUT/found/. Nothing under OUT is meant to be committed.

Under AddressSanitizer + UBSan (an instrumented build of the extension, loaded in place of the normal one):

    CFLAGS='-fsanitize=address,undefined -fno-omit-frame-pointer -g -O1 -fno-sanitize-recover=undefined' \\
    LDFLAGS='-fsanitize=address,undefined' .venv/bin/python setup.py build_ext \\
        --build-lib /tmp/fuzz-asan/lib --build-temp /tmp/fuzz-asan/tmp
    .venv/bin/python scripts/fuzz_scanners.py --minutes 20 \\
        --ext /tmp/fuzz-asan/lib/frscope/records/_frscan.cpython-311-x86_64-linux-gnu.so

(--ext makes the children run with LD_PRELOAD=$(gcc -print-file-name=libasan.so), PYTHONMALLOC=malloc so
that the extension's PyMem buffers are ASan's, ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1.)
Without --ext the normal build is fuzzed (crashes and divergences only). More seeds: --extra DIR, e.g. the
folder `python -m frscope.testing.randprog replay SEED --keep DIR` writes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_ext(path: str) -> None:
    """The extension at `path` (an instrumented build) as frscope.records._frscan, before scan imports it."""
    spec = importlib.util.spec_from_file_location("frscope.records._frscan", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["frscope.records._frscan"] = module
    spec.loader.exec_module(module)


def child(args: argparse.Namespace) -> int:
    if args.ext:
        _load_ext(args.ext)
    from frscope.records import scan
    from frscope.testing.scanfuzz import Result, as_text, check, inputs, seeds
    from frscope.testing.scanfuzz.oracle import scratch
    if args.ext:
        assert scan._frscan is not None and scan._frscan.__file__ == args.ext, scan._frscan
    out = Path(args.out)
    pool = seeds(ROOT / "tests" / "data", [Path(p) for p in args.extra])[args.target]
    rng = random.Random(args.seed)
    current = out / f"{args.target}.current"
    stats = out / f"{args.target}.stats.{args.seed}"
    deadline = time.monotonic() + args.seconds
    done = found = 0
    with scratch() as tmp:
        for data, how in inputs(args.target, pool, rng, args.cut_seeds):
            if time.monotonic() > deadline:
                break
            current.write_bytes(data)
            (out / f"{args.target}.how").write_text(how)
            findings = check(args.target, data, Path(tmp), args.slow, rng.random() < args.reference)
            done += 1
            if findings:
                found += 1
                name = out / "found" / f"{args.target}-{args.seed}-{done}-{findings[0].kind}.bin"
                name.write_bytes(data)
                with (out / "findings.jsonl").open("a") as log:
                    log.write(as_text(Result(args.target, data, how, findings))[:4000] + "\n")
            if done % 50 == 0:
                stats.write_text(json.dumps({"inputs": done, "findings": found}))
    stats.write_text(json.dumps({"inputs": done, "findings": found}))
    return 0


def _env(ext: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if ext:
        asan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                              check=True).stdout.strip()
        env.update(LD_PRELOAD=asan, PYTHONMALLOC="malloc",
                   ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=0:print_summary=1",
                   UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    return env


def parent(args: argparse.Namespace) -> int:
    out = Path(args.out)
    for sub in ("found", "crash"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    targets = args.targets.split(",")
    each = args.minutes * 60 / len(targets)
    rng = random.Random(args.seed)
    crashes = 0
    for target in targets:
        deadline = time.monotonic() + each
        first = True
        while (left := deadline - time.monotonic()) > 5:
            seed = rng.randrange(1 << 30)
            cmd = [sys.executable, __file__, "--child", "--target", target, "--seed", str(seed), "--seconds",
                   str(int(left)), "--out", str(out), "--slow", str(args.slow), "--reference", str(args.reference),
                   "--cut-seeds", str(args.cut_seeds if first else 0)]
            cmd += [x for p in args.extra for x in ("--extra", p)] + (["--ext", args.ext] if args.ext else [])
            log = out / f"{target}.log"
            with log.open("wb") as handle:
                proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=_env(args.ext), cwd=ROOT)
                hung = False
                while proc.poll() is None:
                    time.sleep(1)
                    current = out / f"{target}.current"
                    if current.exists() and time.time() - current.stat().st_mtime > args.hang:
                        proc.kill()
                        proc.wait()
                        hung = True
            first = False
            if proc.returncode != 0 or hung:
                crashes += 1
                kept = out / "crash" / f"{target}-{seed}"
                shutil.copy(out / f"{target}.current", kept.with_suffix(".bin"))
                tail = log.read_bytes()[-20000:]
                how = (out / f"{target}.how").read_text() if (out / f"{target}.how").exists() else "?"
                kept.with_suffix(".log").write_bytes(f"rc={proc.returncode} hung={hung} how={how}\n".encode() + tail)
                print(f"{target}: child {seed} {'hung' if hung else f'exited {proc.returncode}'}: {kept}.bin",
                      flush=True)
        total = sum(json.loads(p.read_text())["inputs"] for p in out.glob(f"{target}.stats.*"))
        print(f"{target}: {total} inputs in {each:.0f} s", flush=True)
    print(f"crashes/hangs: {crashes}; findings: {out / 'findings.jsonl'}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="pickle,json,envelope")
    p.add_argument("--minutes", type=float, default=10.0, help="in all, shared by the targets")
    p.add_argument("--out", default="/tmp/frscope-fuzz")
    p.add_argument("--ext", help="an instrumented build of the extension to load (ASan: see above)")
    p.add_argument("--extra", action="append", default=[], help="more seed folders")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slow", type=float, default=1.0, help="CPU seconds past which one reading is a finding")
    p.add_argument("--reference", type=float, default=0.25,
                   help="the share of inputs the scanner declines whose reference reading is checked too")
    p.add_argument("--cut-seeds", type=int, default=0,
                   help="first, every cut of this many of the smallest seeds (the first child of each target)")
    p.add_argument("--hang", type=float, default=60.0, help="seconds on one input before the child is killed")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
