"""One self-contained HTML page: the findings panel and the collective timeline drawn on a <canvas>.

Everything is inline (CSS, JS, data); a Content-Security-Policy forbids every fetch, so the file works
from a laptop's disk with no network, and a crafted dump cannot make it load anything. The operator's
web UI (frscope.webui) serves the same page with `live` set: it then re-fetches its data from the
job's own URLs (and the policy allows exactly that: 'self').

The data from the dumps (paths, function names, stacks) only ever reaches the page as JSON inside a
<script type="application/json"> block (with '<' escaped) and is put in the DOM with textContent.
"""

from __future__ import annotations

import html
import json
from functools import cache
from importlib import resources
from typing import Any

from frscope.analysis import Finding, Report
from frscope.records import DumpSet
from frscope.records.limits import MAX_RANK
from frscope.report.filters import RANK_PART
from frscope.report.serialize import finite, report_to_dict
from frscope.report.timeline import TimelineOptions, build_timeline

_STATIC_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
    "connect-src 'none'; base-uri 'none'; form-action 'none'"
)
_LIVE_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'"
)


@cache
def asset(name: str) -> str:
    """The viewer's inline CSS / JS (frscope/report/assets/)."""
    return resources.files("frscope.report").joinpath("assets", name).read_text(encoding="utf-8")


def viewer_script() -> str:
    """timeline.js, timeline_panels.js and timeline_list.js in one closure (they share its functions and
    state)."""
    parts = (asset("timeline.js"), asset("timeline_panels.js"), asset("timeline_list.js"))
    return '(function () {\n  "use strict";\n' + "".join(parts) + "})();\n"


def embed_json(obj: Any) -> str:
    """JSON that is safe inside <script type="application/json">: no '</script>', no '<!--'."""
    text = json.dumps(finite(obj), separators=(",", ":"), allow_nan=False)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _body(noscript: str, nav: str) -> str:
    return f"""<header id="fr-header">
  <div class="brand">{nav}frscope &middot; collective timeline <span id="fr-live" class="live" hidden></span></div>
  <h1 id="fr-verdict">{noscript}</h1>
  <div id="fr-meta"></div>
</header>
<main>
  <aside id="fr-findings">
    <h2>Findings</h2>
    <div id="fr-findings-body"></div>
    <div id="fr-status" class="status-summary"></div>
    <div id="fr-perf" hidden></div>
  </aside>
  <section id="fr-timeline" class="panel">
    <h2>Collectives across ranks</h2>
    <div id="fr-empty" class="hint" hidden>No recorder data yet.</div>
    <div id="fr-timeline-body">
      <div id="fr-toolbar">
        <label>group <input id="fr-group-search" type="search" placeholder="search groups" spellcheck="false">
          <select id="fr-group"></select> <span id="fr-group-count" class="hint"></span></label>
        <label>ranks <input id="fr-ranks" type="text" placeholder="all, e.g. 0-7,12" spellcheck="false"></label>
        <label>jump to <input id="fr-jump" type="text" placeholder="rank 12 or #340" spellcheck="false"></label>
        <span id="fr-jump-msg" class="hint"></span>
        <span>x axis
          <label><input type="radio" name="fr-mode" id="fr-mode-seq" value="seq" checked> sequence</label>
          <label><input type="radio" name="fr-mode" id="fr-mode-time" value="time"> time</label>
        </span>
        <button type="button" id="fr-zoom-stuck">zoom to stuck collective</button>
        <button type="button" id="fr-reset">reset view</button>
        <button type="button" id="fr-ops-all">all ops</button>
        <a id="fr-trace" hidden download>trace.json (Perfetto)</a>
        <a id="fr-bundle" hidden download title="frscope analyze BUNDLE">incident bundle</a>
      </div>
      <div id="fr-ops" title="op filter"></div>
      <div id="fr-state-filter" title="state filter"></div>
      <div id="fr-states"></div>
      <div id="fr-canvas-wrap">
        <canvas id="fr-canvas" aria-label="collective timeline"></canvas>
        <div id="fr-tooltip" hidden></div>
      </div>
      <div class="hint" id="fr-sampled"></div>
      <div id="fr-details"></div>
      <div id="fr-list">
        <div class="fr-list-bar"><h2>Collectives</h2>
          <label>sort <select id="fr-list-sort">
            <option value="seq">by sequence id</option>
            <option value="duration">longest duration first</option>
            <option value="wait">longest wait for the last rank first</option>
            <option value="spread">widest arrival spread first</option>
          </select></label> <span id="fr-list-count" class="hint"></span></div>
        <div id="fr-list-scroll">
          <div id="fr-list-head" class="fr-list-row head"></div>
          <div id="fr-list-viewport"><div id="fr-list-spacer"></div><div id="fr-list-rows"></div></div>
        </div>
      </div>
    </div>
  </section>
</main>"""


def render_html(
    report: dict[str, Any] | None,
    timeline: dict[str, Any] | None,
    *,
    title: str = "frscope report",
    live: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    revision: str | None = None,
    nav: tuple[str, str] | None = None,
    perf: dict[str, Any] | None = None,
) -> str:
    """The page for a report dict (report_to_dict) and timeline data (build_timeline).

    `live`: {"data_url", "summary_url", "events_url", "poll_s", "title"} for the operator's live page;
    `status`: per-rank status {rank: {"state": ..., "detail": ...}} drawn next to the rank axis;
    `nav`: (href, text) of a link back (the web UI's job list);
    `perf`: where the time goes (frscope.report.perf.perf_to_dict), shown in the findings panel.
    """
    data = {
        "report": report, "timeline": timeline, "live": live, "status": status or {}, "revision": revision,
        "perf": perf,
        "syntax": {"rank_part": RANK_PART, "max_rank": MAX_RANK},
    }
    verdict = report.get("verdict") if report else None
    noscript = html.escape(str(verdict) if verdict else "frscope")
    csp = _LIVE_CSP if live else _STATIC_CSP
    nav_html = f'<a href="{html.escape(nav[0])}">{html.escape(nav[1])}</a> ' if nav else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>{html.escape(title)}</title>\n"
        f"<style>\n{asset('timeline.css')}</style>\n</head>\n<body>\n"
        f"{_body(noscript, nav_html)}\n"
        f'<script type="application/json" id="frscope-data">{embed_json(data)}</script>\n'
        f"<script>\n{viewer_script()}</script>\n"
        "</body>\n</html>\n"
    )


def render_report_html(
    report: Report,
    dumpset: DumpSet,
    findings: list[Finding] | None = None,
    *,
    title: str | None = None,
    options: TimelineOptions | None = None,
    perf: dict[str, Any] | None = None,
) -> str:
    """`frscope analyze --html`: the report and its timeline in one file (`perf`: perf_to_dict, with --perf)."""
    report_dict = report_to_dict(report, findings=findings)
    timeline = build_timeline(dumpset, report, options)
    return render_html(report_dict, timeline, title=title or f"frscope: {report_dict['verdict'][:120]}", perf=perf)
