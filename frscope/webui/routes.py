"""aiohttp routes of the web UI. Mount with `parent.add_subapp("/ui", create_app(provider))`.

    GET /                                    the watched jobs and their verdicts (refreshes itself)
    GET /api/jobs                            the same, JSON
    GET /jobs/{namespace}/{name}             the job's live page: findings + collective timeline
    GET /jobs/{namespace}/{name}/data        JSON {summary, report, timeline, status, revision}
    GET /jobs/{namespace}/{name}/summary     JSON {revision, verdict, healthy, ...} (polling fallback)
    GET /jobs/{namespace}/{name}/events      server-sent events: `job` {revision, verdict, ...} on connect
                                             and whenever the provider's answer changes
    GET /jobs/{namespace}/{name}/trace.json  the timeline shown as a Chrome/Perfetto trace (a provider with
                                             `fresh_timeline(namespace, name)` is asked when it has none yet)
    GET /jobs/{namespace}/{name}/bundle      the latest incident's evidence as one file, for `frscope analyze
                                             BUNDLE` (a provider with `incident_bundle(namespace, name)`)
    GET /nodes, /api/nodes                   the node ledger (with a NodeProvider; `nodes.py`)

The page fetches `data` again only when the revision it is told about differs from the one it shows.
Every URL the pages use is relative, so the mount prefix does not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import inspect
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import quote

from aiohttp import web

from frscope.report.html import asset, embed_json, render_html
from frscope.report.trace import trace_from_timeline
from frscope.webui.nodes import NodeProvider, nodes_page, ordered
from frscope.webui.provider import JobDetail, JobProvider, JobSummary, detail_revision

T = TypeVar("T")

DEFAULT_POLL_S = 1.0  # how often an event stream asks the provider (in memory: cheap)
KEEPALIVE_S = 15.0
UI_KEY: web.AppKey[WebUI] = cast("web.AppKey[WebUI]", web.AppKey("frscope_webui", object))
# Set on a request by an access-control middleware: may this caller see jobs of that namespace? The
# job list shows only those (a namespace the caller may not read is left out, not refused).
VISIBLE_NAMESPACE = "frscope.visible_namespace"
NamespaceCheck = Callable[[str], Awaitable[bool]]
# Set the same way: may this caller see the node ledger (cluster-scoped)? Unset: yes. A typed request key
# where aiohttp has them (3.12+: a plain string key warns).
VISIBLE_NODES: Any = (web.RequestKey("frscope_visible_nodes", object) if hasattr(web, "RequestKey")
                      else "frscope.visible_nodes")
NodesCheck = Callable[[], Awaitable[bool]]


async def _resolve(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value


def _summary_json(summary: JobSummary | None, revision: str) -> dict[str, Any]:
    if summary is None:
        return {"revision": revision, "gone": True}
    out = summary.to_dict()
    out["revision"] = revision
    out["gone"] = False
    return out


class WebUI:
    def __init__(
        self, provider: JobProvider, *, poll_s: float = DEFAULT_POLL_S, keepalive_s: float = KEEPALIVE_S,
        nodes: NodeProvider | None = None,
    ) -> None:
        self.provider = provider
        self.node_provider = nodes
        self.poll_s = poll_s
        self.keepalive_s = keepalive_s
        self.closing = asyncio.Event()

    async def on_shutdown(self, _: web.Application) -> None:
        self.closing.set()

    async def _jobs(self, request: web.Request) -> Sequence[JobSummary]:
        jobs = await _resolve(self.provider.jobs())
        visible: NamespaceCheck | None = request.get(VISIBLE_NAMESPACE)
        if visible is None:
            return jobs
        shown = {ns for ns in {j.namespace for j in jobs} if await visible(ns)}
        return [j for j in jobs if j.namespace in shown]

    async def _job(self, request: web.Request) -> tuple[str, str, JobDetail | None]:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        return namespace, name, await _resolve(self.provider.job(namespace, name))

    # -- job list ----------------------------------------------------------------------------------
    async def index(self, request: web.Request) -> web.Response:
        if not request.path.endswith("/"):
            raise web.HTTPFound(request.path + "/")
        jobs = await self._jobs(request)
        data = {"jobs": [j.to_dict() for j in jobs], "poll_s": max(self.poll_s, 3.0)}
        page = _jobs_page(jobs, data, nodes_link=self.node_provider is not None)
        return web.Response(text=page, content_type="text/html", headers=_NO_STORE)

    async def jobs_json(self, request: web.Request) -> web.Response:
        jobs = await self._jobs(request)
        return web.json_response({"jobs": [j.to_dict() for j in jobs]}, headers=_NO_STORE)

    # -- the node ledger ---------------------------------------------------------------------------
    async def _nodes(self, request: web.Request) -> list[Any]:
        if self.node_provider is None:
            raise web.HTTPNotFound(text="the node ledger is off (--node-ledger off)")
        allowed: NodesCheck | None = request.get(VISIBLE_NODES)
        if allowed is not None and not await allowed():
            raise web.HTTPForbidden(text="you may not list flightrecordernodes")
        return ordered(await _resolve(self.node_provider.nodes()))

    async def nodes_page(self, request: web.Request) -> web.Response:
        return web.Response(text=nodes_page(await self._nodes(request)), content_type="text/html", headers=_NO_STORE)

    async def nodes_json(self, request: web.Request) -> web.Response:
        return web.json_response({"nodes": [n.to_dict() for n in await self._nodes(request)]}, headers=_NO_STORE)

    # -- one job -----------------------------------------------------------------------------------
    async def job_page(self, request: web.Request) -> web.Response:
        namespace, name, detail = await self._job(request)
        if detail is None:
            raise web.HTTPNotFound(text=f"no watched job {namespace}/{name}")
        revision = detail_revision(detail)
        here = quote(name, safe="")
        live = {
            "data_url": f"{here}/data",
            "summary_url": f"{here}/summary",
            "events_url": f"{here}/events",
            "trace_url": f"{here}/trace.json",
            "bundle_url": f"{here}/bundle" if await self._bundle(namespace, name) is not None else None,
            "poll_s": max(self.poll_s, 1.0),
            "title": f"{namespace}/{name}",
        }
        page = render_html(
            detail.report,
            detail.timeline,
            title=f"{namespace}/{name} - frscope",
            live=live,
            status={str(r): s.to_dict() for r, s in sorted(detail.ranks.items())},
            revision=revision,
            nav=("../../", f"\u2190 jobs \u00b7 {namespace}/{name}"),
            perf=detail.perf,
        )
        return web.Response(text=page, content_type="text/html", headers=_NO_STORE)

    async def job_data(self, request: web.Request) -> web.Response:
        namespace, name, detail = await self._job(request)
        if detail is None:
            raise web.HTTPNotFound(text=f"no watched job {namespace}/{name}")
        response = web.json_response(detail.to_dict(detail_revision(detail)), headers=_NO_STORE)
        response.enable_compression()
        return response

    async def job_trace(self, request: web.Request) -> web.Response:
        """The timeline the page shows (the live window, or the incident's) as a Chrome/Perfetto trace."""
        namespace, name, detail = await self._job(request)
        if detail is None:
            raise web.HTTPNotFound(text=f"no watched job {namespace}/{name}")
        timeline = detail.timeline
        fresh = getattr(self.provider, "fresh_timeline", None)
        if timeline is None and fresh is not None:
            timeline = await fresh(namespace, name)
        if timeline is None:
            raise web.HTTPNotFound(text=f"no collectives recorded for {namespace}/{name} yet")
        body = await asyncio.to_thread(lambda: json.dumps(trace_from_timeline(timeline), separators=(",", ":")))
        filename = re.sub(r"[^A-Za-z0-9._-]", "_", f"{namespace}-{name}")[:120] + "-trace.json"
        response = web.Response(text=body, content_type="application/json", headers={
            **_NO_STORE, "Content-Disposition": f'attachment; filename="{filename}"'})
        response.enable_compression()
        return response

    async def _bundle(self, namespace: str, name: str) -> tuple[Path, str] | None:
        kept = getattr(self.provider, "incident_bundle", None)
        return cast("tuple[Path, str] | None", await kept(namespace, name)) if kept is not None else None

    async def job_bundle(self, request: web.Request) -> web.StreamResponse:
        """The latest incident's bundle (records.bundle), as a download."""
        namespace, name, detail = await self._job(request)
        if detail is None:
            raise web.HTTPNotFound(text=f"no watched job {namespace}/{name}")
        kept = await self._bundle(namespace, name)
        if kept is None:
            raise web.HTTPNotFound(text=f"no incident bundle kept for {namespace}/{name} (--evidence-dir)")
        path, incident = kept
        filename = re.sub(r"[^A-Za-z0-9._-]", "_", f"{namespace}-{name}-{incident}")[:160] + ".frscope-bundle.json.gz"
        return web.FileResponse(path, headers={**_NO_STORE, "Content-Type": "application/gzip",
                                               "Content-Disposition": f'attachment; filename="{filename}"'})

    async def job_summary(self, request: web.Request) -> web.Response:
        _, _, detail = await self._job(request)
        revision = detail_revision(detail)
        return web.json_response(_summary_json(detail.summary if detail else None, revision), headers=_NO_STORE)

    async def job_events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        last: str | None = None
        last_write = time.monotonic()
        with contextlib.suppress(ConnectionError):
            while not self.closing.is_set():
                _, _, detail = await self._job(request)
                revision = detail_revision(detail)
                if revision != last:
                    body = json.dumps(_summary_json(detail.summary if detail else None, revision))
                    await response.write(f"event: job\nid: {revision}\ndata: {body}\n\n".encode())
                    last, last_write = revision, time.monotonic()
                elif time.monotonic() - last_write >= self.keepalive_s:
                    await response.write(b": keepalive\n\n")
                    last_write = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.closing.wait(), timeout=self.poll_s)
        return response


_NO_STORE = {"Cache-Control": "no-store"}
_NODES_LINK = ' <a href="nodes">The node ledger</a>: nodes implicated across jobs.'

_JOBS_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'"
)

_JOBS_JS = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("frscope-jobs").textContent);
  function cell(text, cls) {
    var td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td;
  }
  function draw(jobs) {
    var body = document.getElementById("jobs-body");
    while (body.firstChild) body.removeChild(body.firstChild);
    if (!jobs.length) {
      var tr = document.createElement("tr"); var td = cell("No watched jobs yet.", "hint"); td.colSpan = 5;
      tr.appendChild(td); body.appendChild(tr);
    }
    jobs.forEach(function (j) {
      var tr = document.createElement("tr");
      tr.className = j.healthy === false ? "bad" : (j.healthy ? "ok" : "");
      tr.setAttribute("data-job", j.namespace + "/" + j.name);
      var name = document.createElement("td"), a = document.createElement("a");
      a.href = "jobs/" + encodeURIComponent(j.namespace) + "/" + encodeURIComponent(j.name);
      a.textContent = j.namespace + "/" + j.name;
      name.appendChild(a); tr.appendChild(name);
      tr.appendChild(cell(j.state || "-"));
      tr.appendChild(cell(j.stalled ? "stalled" : "progressing"));
      tr.appendChild(cell(j.verdict || "not diagnosed", "verdict"));
      tr.appendChild(cell(j.updated_at ? new Date(j.updated_at * 1000).toLocaleTimeString() : "-"));
      body.appendChild(tr);
    });
    document.body.setAttribute("data-ready", "true");
  }
  draw(data.jobs);
  setInterval(function () {
    fetch("api/jobs", {cache: "no-store"}).then(function (r) { return r.json(); })
      .then(function (d) { draw(d.jobs); }).catch(function () {});
  }, data.poll_s * 1000);
})();
"""


def _jobs_page(jobs: Sequence[JobSummary], data: dict[str, Any], *, nodes_link: bool = False) -> str:
    rows = "".join(
        f'<tr data-job="{html.escape(j.namespace)}/{html.escape(j.name)}"><td>{html.escape(j.namespace)}/'
        f"{html.escape(j.name)}</td><td></td><td></td><td>{html.escape(j.verdict or 'not diagnosed')}</td>"
        "<td></td></tr>"
        for j in jobs
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_JOBS_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n<link rel="icon" href="data:,">\n'
        f"<title>frscope: watched jobs</title>\n<style>\n{asset('timeline.css')}</style>\n</head>\n<body>\n"
        '<header id="fr-header"><div class="brand">frscope &middot; watched jobs</div>'
        '<h1 id="fr-verdict">PyTorch jobs watched by frscope</h1>'
        '<div id="fr-meta">Each job\'s latest diagnosis; open a job for its live collective timeline.'
        f'{_NODES_LINK if nodes_link else ""}</div></header>\n'
        '<div style="padding:14px 20px"><table class="jobs"><thead><tr><th>job</th><th>state</th><th>progress</th>'
        f'<th>verdict</th><th>updated</th></tr></thead><tbody id="jobs-body">{rows}</tbody></table></div>\n'
        f'<script type="application/json" id="frscope-jobs">{embed_json(data)}</script>\n'
        f"<script>{_JOBS_JS}</script>\n</body>\n</html>\n"
    )


def create_app(
    provider: JobProvider, *, poll_s: float = DEFAULT_POLL_S, keepalive_s: float = KEEPALIVE_S,
    middlewares: Iterable[Any] = (), nodes: NodeProvider | None = None,
) -> web.Application:
    """The web UI as an aiohttp application, to mount with `add_subapp(prefix, app)` (or to run alone).
    `middlewares` run before every route (the operator's access control); `nodes`: the node ledger's page."""
    ui = WebUI(provider, poll_s=poll_s, keepalive_s=keepalive_s, nodes=nodes)
    app = web.Application(middlewares=list(middlewares))
    app[UI_KEY] = ui
    app.on_shutdown.append(ui.on_shutdown)
    app.add_routes(
        [
            web.get("/", ui.index),
            web.get("/api/jobs", ui.jobs_json),
            web.get("/jobs/{namespace}/{name}", ui.job_page),
            web.get("/jobs/{namespace}/{name}/data", ui.job_data),
            web.get("/jobs/{namespace}/{name}/summary", ui.job_summary),
            web.get("/jobs/{namespace}/{name}/events", ui.job_events),
            web.get("/jobs/{namespace}/{name}/trace.json", ui.job_trace),
            web.get("/jobs/{namespace}/{name}/bundle", ui.job_bundle),
            web.get("/nodes", ui.nodes_page),
            web.get("/api/nodes", ui.nodes_json),
        ]
    )
    return app
