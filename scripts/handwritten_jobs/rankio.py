"""What every rank of a hand-written job shares: where it writes, its progress file for the controller, and
its dumps (torch's pickle, JSON dump and faulthandler stacks), written when the controller creates
JOB_OUT/trigger, on the rank's error path, or by a scenario itself (a periodic or an end-of-run dump). The
time each rank's dumps were written goes to captured_<rank> (the truth's capture time)."""

import faulthandler
import os
import threading
import time

from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

OUT = os.environ["JOB_OUT"]
RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
TRIG = os.path.join(OUT, "trigger")
_frozen = []  # a scenario froze this rank's dumps: later requests leave the old ones in place
_lock = threading.Lock()  # the error path and the trigger's watcher may ask at once
# Under a launcher the controller knows this process only from here (a restarted rank replaces its pid, and
# the done mark of its earlier incarnation is no answer from this one).
with open(f"{OUT}/pid_{RANK}", "w") as _f:
    _f.write(f"{os.getpid()} {os.getppid()}")
if os.path.exists(f"{OUT}/done_{RANK}"):
    os.unlink(f"{OUT}/done_{RANK}")


def write_dumps(freeze=False):
    with _lock:
        _write_dumps(freeze)


def _write_dumps(freeze):
    if _frozen:
        open(f"{OUT}/done_{RANK}", "w").close()
        return
    j = _dump_fr_trace_json(True, False)
    p = _dump_fr_trace(True, True, False)
    t = time.time_ns()
    # each file written beside and renamed into place: a rank that exits while a later request writes (its
    # error path ends the process) leaves the earlier files whole, never a truncated one
    with open(f"{OUT}/.rank_{RANK}.json", "wb") as f:
        f.write(j if isinstance(j, bytes) else j.encode())
    with open(f"{OUT}/.rank_{RANK}.pkl", "wb") as f:
        f.write(p)
    with open(f"{OUT}/.rank_{RANK}.stack.txt", "w") as f:
        faulthandler.dump_traceback(f, all_threads=True)
    for name in ("json", "pkl", "stack.txt"):
        os.replace(f"{OUT}/.rank_{RANK}.{name}", f"{OUT}/rank_{RANK}.{name}")
    with open(f"{OUT}/captured_{RANK}", "w") as f:
        f.write(str(t))
    if freeze:
        _frozen.append(True)
    open(f"{OUT}/done_{RANK}", "w").close()


def _watcher():
    while not os.path.exists(TRIG):
        time.sleep(0.05)
    write_dumps()


def start_watcher():
    threading.Thread(target=_watcher, daemon=True).start()


def progress(step):
    with open(f"{OUT}/prog_{RANK}", "w") as f:
        f.write(str(step))


def hang_here():
    while True:
        time.sleep(1)
