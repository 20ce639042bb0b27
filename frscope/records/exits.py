"""How a rank's process ended, as whoever ran it knows (Kubernetes, a launcher): evidence beside the dumps.

A rank that crashed (OOM-killed, segfault, an exception) leaves no dump or a stale one; its exit is
often the only direct evidence. The operator builds these from the trainer container's status
(`state.terminated` / `lastState.terminated`: exit code, reason such as `OOMKilled`, the
termination message that `FallbackToLogsOnError` fills from the log tail, `restartCount`); the CLI
reads them from a JSON file (`frscope analyze --exits`). Pure data: nothing here talks to anything.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The termination message is the tail of a log: keep what a report line can hold.
MESSAGE_LIMIT = 400
_PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker crash"
                        r"|remote process exited", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RankExit:
    """One rank's process end. `exit_code` as a container runtime reports it (128 + N for signal N)."""

    rank: int
    exit_code: int | None = None
    reason: str = ""  # 'OOMKilled', 'Error', 'Completed', ...
    message: str = ""  # the termination message (last lines of the log), one line
    restart_count: int = 0
    finished_at_ns: int | None = None  # when the process ended (ns since the epoch), if known
    source: str = ""  # where this came from: 'pod ns/name container trainer', a file, ...
    first_failure: bool = False  # the launcher named it the first failure (torchrun's "Root Cause")

    @property
    def failed(self) -> bool:
        return self.reason == "OOMKilled" or (self.exit_code is not None and self.exit_code != 0)

    @property
    def peer_gone(self) -> bool:
        """Its own error says a peer went away first (gloo's "Connection closed by peer ... caused by a
        remote worker crashing", a reset connection, NCCL's "remote process exited"): a victim."""
        return bool(_PEER_GONE.search(self.message))

    @property
    def terminated(self) -> bool:
        """Ended by SIGTERM (143, or -15 from Popen), not OOM-killed: something outside stopped it (a
        launcher tearing down the other ranks after a failure, the kubelet ending the pod, a preemption).
        A victim beside a rank that failed on its own; the culprit only when no such rank exists."""
        return self.exit_code in (143, -15) and self.reason != "OOMKilled"

    def describe(self) -> str:
        """'exited with code 137 (SIGKILL), reason OOMKilled, after 2 restarts: <message>'."""
        parts = []
        if self.exit_code is not None:
            sig = signal_name(self.exit_code)
            parts.append(f"exited with code {self.exit_code}" + (f" ({sig})" if sig else ""))
        else:
            parts.append("ended")
        if self.reason and self.reason not in ("Error", "Completed"):
            parts.append(f"reason {self.reason}")
        if self.restart_count:
            parts.append(f"restarted {self.restart_count} time{'s' if self.restart_count != 1 else ''}")
        text = ", ".join(parts)
        if self.message:
            text += f": {self.message}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "exit_code": self.exit_code,
            "signal": signal_name(self.exit_code) if self.exit_code is not None else None,
            "reason": self.reason or None,
            "message": self.message or None,
            "restart_count": self.restart_count,
            "finished_at_ns": self.finished_at_ns,
            "source": self.source or None,
            "first_failure": self.first_failure,
        }


def most_likely_first(ranks: list[int], exits: Mapping[int, RankExit]) -> list[int]:
    """Of failed ranks, the ones whose failure most likely came first: those the launcher named its first
    failure and whose own error neither blames a peer nor is a SIGTERM from outside; else those that fail
    on their own (neither), the killed ones first where the rest only exited with an error code and no
    message (`_killed_before_plain`); else those not blaming a peer (a SIGTERM'd rank when every other one
    blames a peer: a preemption); else all."""
    def known(rank: int) -> RankExit:
        return exits.get(rank) or RankExit(rank)

    def own(rank: int) -> bool:
        return not known(rank).peer_gone and not known(rank).terminated

    first = [r for r in ranks if known(r).first_failure and own(r)]
    return (first or _killed_before_plain([known(r) for r in ranks if own(r)])
            or [r for r in ranks if not known(r).peer_gone] or list(ranks))


def _killed_before_plain(own: list[RankExit]) -> list[int]:
    """Ranks that fail on their own, the killed ones alone where the others only exited with an error code
    and left no message: a peer of a rank that went away raises in Python (gloo's "Connection closed by
    peer") and exits with an error code; nothing in a peer's failure makes a process die by a signal
    (SIGKILL, SIGABRT, SIGSEGV: an OOM kill, an abort, a crash). A SIGTERM is a teardown (`terminated`,
    not here). Without messages, the codes are all that tells the first failure from its consequences."""
    killed = [e.rank for e in own if e.reason == "OOMKilled" or (e.exit_code is not None and signal_name(e.exit_code))]
    plain = [e.rank for e in own if e.rank not in killed and not e.message]
    if killed and plain and len(killed) + len(plain) == len(own):
        return killed
    return [e.rank for e in own]


def signal_name(exit_code: int) -> str | None:
    """137 -> 'SIGKILL' (container runtimes), -9 -> 'SIGKILL' (Python's Popen)."""
    number = exit_code - 128 if exit_code > 128 else -exit_code if exit_code < 0 else 0
    if number <= 0:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """A log tail -> its last lines, joined, at most `limit` characters (the end is what matters)."""
    joined = " | ".join(line.strip() for line in text.splitlines() if line.strip())
    return joined if len(joined) <= limit else "..." + joined[-(limit - 3) :]


def exits_from_json(obj: Any, source: str) -> list[RankExit]:
    """`{"2": 137}` or `{"2": {"exit_code": 137, "reason": "OOMKilled", ...}}` or a list of such
    objects with a `rank`: what `frscope analyze --exits FILE` accepts. Bad items raise ValueError."""
    items: list[tuple[Any, Any]]
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, list):
        items = [(item.get("rank") if isinstance(item, dict) else None, item) for item in obj]
    else:
        raise ValueError(f"{source}: expected an object keyed by rank, or a list")
    out: list[RankExit] = []
    for key, value in items:
        try:
            rank = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"{source}: {key!r} is not a rank number") from None
        if isinstance(value, int) and not isinstance(value, bool):
            out.append(RankExit(rank, exit_code=value, source=source))
            continue
        if not isinstance(value, dict):
            raise ValueError(f"{source}: rank {rank}: expected an exit code or an object")
        code = value.get("exit_code")
        restarts = value.get("restart_count", 0)
        finished = value.get("finished_at_ns")
        out.append(RankExit(
            rank,
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            reason=str(value.get("reason") or ""),
            message=one_line(str(value.get("message") or "")),
            restart_count=restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else 0,
            finished_at_ns=finished if isinstance(finished, int) and not isinstance(finished, bool) else None,
            source=str(value.get("source") or source),
            first_failure=value.get("first_failure") is True,
        ))
    return out
