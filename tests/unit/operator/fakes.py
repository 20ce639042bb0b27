"""Fakes on the wire for the operator's unit tests (aiohttp servers on loopback, no mocks of our code).

- `FakeKube`: the few API server paths the operator writes to (a job and its status subresource,
  Events, FlightRecorderReports, /version), with resourceVersion preconditions, AlreadyExists, and
  injectable error answers. What the REAL API server decides (pruning, RBAC, status subresource
  semantics, GC) is tested against it in tests/e2e/test_operator_*.py; this fake only lets the
  unit tests run in milliseconds and provoke 409/429/5xx at will.
- `StandInSidecar`: serves the documented sidecar API (/v1/status, /v1/snapshot) from REAL recorder
  snapshots (tests/data/real: produced by the demo's real hung gloo job), with failure modes.
"""

from __future__ import annotations

import asyncio
import copy
import gzip
import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from frscope import wire

REAL = Path(__file__).resolve().parents[2] / "data" / "real"


def real_snapshots(fault: str = "hang") -> dict[int, dict[str, Any]]:
    """rank -> frscope snapshot, as the demo's launcher captured it from a real gloo job."""
    out = {}
    for path in sorted((REAL / fault).glob("rank-*.json")):
        obj = json.loads(path.read_text())
        out[int(obj["rank"])] = obj
    assert out, f"no real snapshots in {REAL / fault}"
    return out


def _resource(plural: str, kind: str, namespaced: bool = True, verbs: tuple[str, ...] = (
        "get", "list", "watch", "create", "patch", "delete")) -> dict[str, Any]:
    return {"name": plural, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
            "verbs": list(verbs)}


def _group(name: str, version: str) -> dict[str, Any]:
    gv = {"groupVersion": f"{name}/{version}", "version": version}
    return {"name": name, "versions": [gv], "preferredVersion": gv}


# Just enough discovery for kopf to find what the operator watches and writes.
DISCOVERY: dict[str, Any] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        _resource("pods", "Pod"), _resource("pods/status", "Pod"), _resource("events", "Event"),
        _resource("namespaces", "Namespace", namespaced=False)]},
    "/apis": {"kind": "APIGroupList", "groups": [
        _group("kubeflow.org", "v1"), _group("frscope.io", "v1alpha1"), _group("apiextensions.k8s.io", "v1")]},
    "/apis/kubeflow.org/v1": {"kind": "APIResourceList", "groupVersion": "kubeflow.org/v1", "resources": [
        _resource("pytorchjobs", "PyTorchJob"), _resource("pytorchjobs/status", "PyTorchJob")]},
    "/apis/frscope.io/v1alpha1": {"kind": "APIResourceList", "groupVersion": "frscope.io/v1alpha1", "resources": [
        _resource("flightrecorderreports", "FlightRecorderReport")]},
    "/apis/apiextensions.k8s.io/v1": {"kind": "APIResourceList", "groupVersion": "apiextensions.k8s.io/v1",
                                      "resources": [_resource("customresourcedefinitions",
                                                              "CustomResourceDefinition", namespaced=False)]},
}


# Cluster-scoped resources the fake keeps (under namespace '').
CLUSTER_SCOPED = frozenset({"nodes", "flightrecordernodes"})


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}


@dataclass
class Fault:
    method: str
    contains: str
    status: int
    times: int
    reason: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class FakeKube:
    """Objects keyed by (plural, namespace, name); every write bumps a global resourceVersion."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.selectors: list[tuple[str, str]] = []  # (plural, labelSelector) of every list and watch
        self.list_pages: list[tuple[str, str | None]] = []  # (plural, its `limit`) of each list request
        self.faults: list[Fault] = []
        self._rv = itertools.count(100)
        self.server: TestServer | None = None
        self.delay_s = 0.0
        self._watchers: list[tuple[str, asyncio.Queue[dict[str, Any]]]] = []

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    def fail(self, method: str, contains: str, status: int, times: int = 1, reason: str = "",
             headers: dict[str, str] | None = None) -> None:
        self.faults.append(Fault(method, contains, status, times, reason, headers or {}))

    def put(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "" if plural in CLUSTER_SCOPED else "ml")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(next(self._rv))
        key = (plural, meta["namespace"], meta["name"])
        self._notify(plural, "MODIFIED" if key in self.objects else "ADDED", obj)
        self.objects[key] = obj
        return obj

    def _notify(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        for watched, queue in self._watchers:
            if watched == plural:
                queue.put_nowait({"type": kind, "object": copy.deepcopy(obj)})

    async def _list_or_watch(self, request: web.Request, plural: str, namespace: str | None) -> web.StreamResponse:
        selector = request.query.get("labelSelector", "")
        self.selectors.append((plural, selector))
        # The API server's equality and existence terms (`key=value`, `key`), ANDed.
        terms = [term.partition("=") for term in selector.split(",") if term and not term.startswith("!")]

        def selected(obj: dict[str, Any]) -> bool:
            labels = obj.get("metadata", {}).get("labels") or {}
            return all(k in labels and (not eq or labels[k] == v) for k, eq, v in terms)

        if request.query.get("watch") != "true":
            self.list_pages.append((plural, request.query.get("limit")))
            items = [o for (p, ns, _), o in self.objects.items()
                     if p == plural and (namespace is None or ns == namespace) and selected(o)]
            meta: dict[str, Any] = {"resourceVersion": str(next(self._rv))}
            if limit := int(request.query.get("limit") or 0):  # chunks, as the API server pages a list
                start = int(request.query.get("continue") or 0)
                items, rest = items[start:start + limit], items[start + limit:]
                if rest:
                    meta["continue"] = str(start + limit)
            return web.json_response({"items": items, "metadata": meta})
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        entry = (plural, queue)
        self._watchers.append(entry)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), 0.1)
                except TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        break  # the watcher went away (aiohttp does not cancel handlers on disconnect)
                    continue
                if namespace is not None and event["object"]["metadata"].get("namespace") != namespace:
                    continue
                if selected(event["object"]):
                    await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.remove(entry)
        return response

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((plural, namespace, name))

    def of(self, plural: str) -> list[dict[str, Any]]:
        return [o for (p, _, _), o in sorted(self.objects.items()) if p == plural]

    def writes(self, method: str | None = None) -> list[tuple[str, str, Any]]:
        return [r for r in self.requests if r[0] != "GET" and (method is None or r[0] == method)]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        path = request.path
        self.requests.append((request.method, path, body))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        for fault in self.faults:
            if fault.times > 0 and fault.method == request.method and fault.contains in path:
                fault.times -= 1
                return web.json_response(status_body(fault.status, fault.reason or "Injected", "injected fault"),
                                         status=fault.status, headers=fault.headers)
        if path == "/version":
            return web.json_response({"major": "1", "minor": "31+", "gitVersion": "v1.31.0"})
        if path in DISCOVERY:
            return web.json_response(DISCOVERY[path])
        parts = path.strip("/").split("/")
        # /api/v1/namespaces/NS/PLURAL[/NAME[/SUB]] or /apis/G/V/namespaces/NS/PLURAL[/NAME[/SUB]]
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if len(rest) == 1 and request.method == "GET":  # cluster-wide list or watch
            return await self._list_or_watch(request, rest[0], None)
        if rest and rest[0] != "namespaces" and rest[0] in CLUSTER_SCOPED:  # /PLURAL[/NAME[/SUB]]: namespace ''
            rest = ["namespaces", "", *rest]
        if len(rest) < 3 or rest[0] != "namespaces":
            return web.json_response(status_body(404, "NotFound", path), status=404)
        namespace, plural = rest[1], rest[2]
        name = rest[3] if len(rest) > 3 else None
        sub = rest[4] if len(rest) > 4 else None
        if request.method == "POST" and name is None:
            assert isinstance(body, dict)
            key = (plural, namespace, body["metadata"]["name"])
            if key in self.objects:
                return web.json_response(status_body(409, "AlreadyExists", f"{key} exists"), status=409)
            body["metadata"]["namespace"] = namespace
            return web.json_response(self.put(plural, body), status=201)
        if name is None:
            return await self._list_or_watch(request, plural, namespace)
        obj = self.objects.get((plural, namespace, name))
        if obj is None:
            return web.json_response(status_body(404, "NotFound", f"{plural} {name} not found"), status=404)
        if request.method == "GET":
            return web.json_response(obj)
        if request.method == "PATCH":
            assert request.content_type == "application/merge-patch+json", request.content_type
            assert isinstance(body, dict)
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
                return web.json_response(status_body(409, "Conflict", "the object has been modified"), status=409)
            if sub == "status":
                patched = dict(obj)
                patched["status"] = merge_patch(obj.get("status"), body.get("status"))
            else:
                body = {k: v for k, v in body.items() if k != "status"}
                patched = merge_patch(obj, body)
                patched["status"] = obj.get("status")
            patched["metadata"]["resourceVersion"] = str(next(self._rv))
            self.objects[(plural, namespace, name)] = patched
            self._notify(plural, "MODIFIED", patched)
            return web.json_response(patched)
        if request.method == "PUT" and sub is None:
            # As the API server: a replace names the resourceVersion it read (a custom resource
            # refuses an unconditional update); status is the status subresource's, not the body's.
            assert isinstance(body, dict)
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted != obj["metadata"]["resourceVersion"]:
                return web.json_response(status_body(409, "Conflict", "the object has been modified"), status=409)
            replaced = copy.deepcopy(body)
            replaced["metadata"] = {**obj["metadata"], **replaced["metadata"],
                                    "resourceVersion": str(next(self._rv)), "uid": obj["metadata"]["uid"]}
            if "status" in obj:
                replaced["status"] = obj["status"]
            self.objects[(plural, namespace, name)] = replaced
            self._notify(plural, "MODIFIED", replaced)
            return web.json_response(replaced)
        if request.method == "DELETE":
            self.objects.pop((plural, namespace, name))
            return web.json_response(status_body(200, "", "deleted"))
        return web.json_response(status_body(405, "MethodNotAllowed", request.method), status=405)

    async def start(self) -> FakeKube:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return self

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()


class StandInSidecar:
    """One pod's sidecar API, fed with real frscope snapshots of the ranks it 'hosts'.

    mode: 'ok' | 'down' (503) | 'garbage' (200, not JSON) | 'wrong-schema' | 'slow' (sleeps `delay_s`)
    | 'flaky' (503 for the first `flaky_failures` snapshot requests, then ok)
    | hostile status answers: 'status-overflow' (a 400-digit age), 'status-deep' (nested 5,000 deep),
    'status-huge' (a valid status padded to 2 MiB).

    etags (the snapshot's validator, frscope.wire's, as the real sidecar gives it): 'ok' (an ETag of the
    ranks and errors served; 304 to an If-None-Match naming it) | 'none' (a sidecar that predates them)
    | hostile: 'huge' (a 4 KiB ETag), 'junk' (an ETag that is no entity tag), 'always-304' (304 Not Modified
    to every request, asked with an ETag or not). `if_none_match`: what each snapshot request sent.
    """

    def __init__(self, pod: str, ranks: dict[int, dict[str, Any]], *, namespace: str = "ml", stalled: bool = True,
                 mode: str = "ok", delay_s: float = 0.0, flaky_failures: int = 0, suspected: bool = False,
                 etags: str = "ok") -> None:
        self.pod = pod
        self.namespace = namespace
        self.ranks = ranks
        self.stalled = stalled
        self.suspected = suspected  # suspected, not confirmed (stalled: confirmed, suspected too)
        self.lateness: dict[int, dict[str, Any]] = {}  # rank -> its /v1/status `lateness` document
        self.arrivals: dict[int, list[list[int]]] = {}  # rank -> group 0's /v1/status `arrivals`
        self.mode = mode
        self.delay_s = delay_s
        self.flaky_failures = flaky_failures
        self.snapshot_requests = 0
        self.etags = etags
        self.if_none_match: list[str | None] = []
        self.status_requests = 0
        self.restart_count: int | None = None  # what the bootstrap tells of torchrun's restarts
        self.snapshot_gate: asyncio.Event | None = None  # when set: snapshots answer once it is set
        self.server: TestServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None and self.server.port is not None
        return self.server.port

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def status_obj(self) -> dict[str, Any]:
        groups = {"0": {"desc": "default_pg", "last_enqueued_seq": 4, "last_completed_seq": 3,
                        "inflight_op": "all_reduce", "inflight_seq": 4, "inflight_age_s": 74.2,
                        "stalled": self.stalled, "stalled_since_ns": 1,
                        "suspected": self.stalled or self.suspected}}
        return {"schema": "frscope.sidecar.status/v1", "pod": self.pod, "namespace": self.namespace,
                "node": "n1", "captured_at_ns": 1, "answered_at_ns": time.time_ns(), "stalled": self.stalled,
                "suspected": self.stalled or self.suspected,
                "ranks": {str(r): {"up": True, "error": None, "last_poll_ns": 1,
                                   "groups": {"0": {**groups["0"], "arrivals": self.arrivals[r]}}
                                   if r in self.arrivals else groups,
                                   "restart_count": self.restart_count, "lateness": self.lateness.get(r)}
                          for r in self.ranks}}

    def snapshot_obj(self) -> dict[str, Any]:
        return {"schema": "frscope.sidecar.snapshot/v1", "pod": self.pod, "namespace": self.namespace,
                "node": "n1", "captured_at_ns": 1, "reason": "refresh",
                "ranks": list(self.ranks.values()), "errors": []}

    async def _misbehave(self) -> web.Response | None:
        if self.mode == "down":
            return web.Response(status=503, text="sidecar is down")
        if self.mode == "garbage":
            return web.Response(status=200, text="<html>not json", content_type="text/html")
        if self.mode == "wrong-schema":
            return web.json_response({"schema": "something/else"})
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        return None

    def _hostile_status(self) -> bytes | None:
        if self.mode == "status-overflow":
            text = json.dumps(self.status_obj())
            return text.replace('"inflight_age_s": 74.2', '"inflight_age_s": ' + "9" * 400).encode()
        if self.mode == "status-deep":
            return b'{"schema": "frscope.sidecar.status/v1", "ranks": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        if self.mode == "status-huge":
            return json.dumps({**self.status_obj(), "padding": "x" * (2 << 20)}).encode()
        return None

    async def _status(self, _: web.Request) -> web.Response:
        self.status_requests += 1
        hostile = self._hostile_status()
        if hostile is not None:
            return web.Response(body=hostile, content_type="application/json")
        bad = await self._misbehave()
        return bad or web.json_response(self.status_obj())

    def _etag(self, gzip_asked: bool) -> str | None:
        obj = self.snapshot_obj()
        if self.etags == "huge":
            return 'W/"' + "a" * 4000 + '"'
        if self.etags == "junk":
            return "not an entity tag"
        if self.etags == "none":
            return None
        return wire.snapshot_etag([json.dumps([obj["ranks"], obj["errors"]], sort_keys=True)], gzip=gzip_asked)

    async def _snapshot(self, request: web.Request) -> web.Response:
        self.snapshot_requests += 1
        self.if_none_match.append(request.headers.get("If-None-Match"))
        if self.snapshot_gate is not None:
            await self.snapshot_gate.wait()
        if self.mode == "flaky" and self.snapshot_requests <= self.flaky_failures:
            return web.Response(status=503, text="warming up")
        bad = await self._misbehave()
        if bad is not None:
            return bad
        etag = self._etag(self.mode == "gzip")
        tagged = {"ETag": etag} if etag is not None else {}
        if self.etags == "always-304" or etag is not None and wire.etag_matches(self.if_none_match[-1], etag):
            return web.Response(status=304, headers=tagged)
        if self.mode == "gzip":
            body = gzip.compress(json.dumps(self.snapshot_obj()).encode())
            return web.Response(body=body, content_type="application/json",
                                headers={"Content-Encoding": "gzip", **tagged})
        return web.json_response(self.snapshot_obj(), headers=tagged)

    async def start(self) -> StandInSidecar:
        app = web.Application()
        app.add_routes([web.get("/v1/status", self._status), web.get("/v1/snapshot", self._snapshot)])
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return self

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()
