"""The node ledger's page: every node a diagnosis implicated, its suspicion score and state
(docs/actions.md, "The node ledger"). Server-rendered, refreshed by the browser every 30 s.

    GET /nodes       the page
    GET /api/nodes   the same, JSON

What it shows comes from a `NodeProvider` (the operator's node ledger, from memory).
"""

from __future__ import annotations

import html
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from frscope.report.html import asset

MAX_RECENT = 8


@dataclass(frozen=True, slots=True)
class NodeIncidentRow:
    at: float
    job: str
    category: str
    evidence: str
    weight: float
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "job": self.job, "category": self.category, "evidence": self.evidence,
                "weight": self.weight, "why": self.why}


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """One node in the ledger."""

    node: str
    score: float
    incidents: int  # incidents that weigh on it
    jobs: int  # distinct jobs among them
    last_incident: float | None
    state: str  # watched | suspected | fenced
    why: str = ""
    pool: str = ""
    fence: str = ""  # the fence record's state ('' when none)
    fence_message: str = ""
    recent: tuple[NodeIncidentRow, ...] = field(default=())  # newest first, at most MAX_RECENT

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "score": self.score, "incidents": self.incidents, "jobs": self.jobs,
                "last_incident": self.last_incident, "state": self.state, "why": self.why, "pool": self.pool,
                "fence": self.fence, "fence_message": self.fence_message,
                "recent": [r.to_dict() for r in self.recent[:MAX_RECENT]]}


class NodeProvider(Protocol):
    def nodes(self) -> Sequence[NodeSummary] | Awaitable[Sequence[NodeSummary]]: ...


_ORDER = {"fenced": 0, "suspected": 1, "watched": 2}
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'")


def ordered(nodes: Sequence[NodeSummary]) -> list[NodeSummary]:
    """Fenced, then suspected, then watched; the highest score first within each."""
    return sorted(nodes, key=lambda n: (_ORDER.get(n.state, 3), -n.score, n.node))


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    seconds = max(now - at, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def nodes_page(nodes: Sequence[NodeSummary], *, now: float | None = None) -> str:
    now = time.time() if now is None else now
    esc = html.escape
    rows = []
    for n in ordered(nodes):
        cls = {"fenced": "bad", "suspected": "bad"}.get(n.state, "ok")
        recent = "".join(
            f"<li>{esc(_ago(r.at, now))}: {esc(r.job)} &middot; {esc(r.category)} &middot; {esc(r.evidence)} "
            f"(weight {r.weight:g}): {esc(r.why)}</li>" for r in n.recent[:MAX_RECENT])
        fence = f"{esc(n.fence)}: {esc(n.fence_message)}" if n.fence else "-"
        rows.append(
            f'<tr class="{cls}" data-node="{esc(n.node)}"><td>{esc(n.node)}<br><small>{esc(n.pool)}</small></td>'
            f'<td class="verdict">{esc(n.state)}</td><td>{n.score:.2f}</td><td>{n.incidents}</td><td>{n.jobs}</td>'
            f"<td>{esc(_ago(n.last_incident, now))}</td><td>{esc(n.why)}<ul>{recent}</ul></td><td>{fence}</td></tr>")
    body = "".join(rows) or '<tr><td colspan="8" class="hint">No node has been implicated by a diagnosis.</td></tr>'
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n<meta http-equiv="refresh" content="30">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n<link rel="icon" href="data:,">\n'
        f"<title>frscope: node ledger</title>\n<style>\n{asset('timeline.css')}</style>\n</head>\n<body>\n"
        '<header id="fr-header"><div class="brand"><a href="./">frscope</a> &middot; node ledger</div>'
        '<h1 id="fr-verdict">Nodes implicated by diagnoses</h1>'
        '<div id="fr-meta">Suspicion: each incident\'s weight (code faults weigh nothing), halved every '
        "half-life; suspected with evidence from two different jobs (docs/actions.md, \"The node ledger\"). "
        "<code>kubectl get frnodes</code></div></header>\n"
        '<div style="padding:14px 20px"><table class="jobs"><thead><tr><th>node</th><th>state</th><th>score</th>'
        "<th>incidents</th><th>jobs</th><th>last incident</th><th>why</th><th>fence</th></tr></thead>"
        f'<tbody id="nodes-body">{body}</tbody></table></div>\n</body>\n</html>\n'
    )
