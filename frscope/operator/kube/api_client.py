"""A small typed Kubernetes API client over aiohttp: the operator's own writes and reads.

kopf watches; this client writes (status, Events, reports, token and access reviews) with retries on
transport errors, 429 and 5xx (`Backoff`), and maps every error answer to the tree in `errors.py`.
The bearer token is asked of `auth` for every request (a rotated service-account token is picked
up at once), and a 401 makes it re-read its source and try once more.
Read-modify-write callers wrap their whole cycle in `retry_on_conflict`.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from frscope.operator.kube.api_errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Gone,
    KubeError,
    TooManyRequests,
    TransportError,
    Unauthorized,
    error_for,
)
from frscope.operator.kube.backoff import Backoff, retrying
from frscope.operator.kube.bodies import read_capped
from frscope.operator.kube.credentials import BearerAuth

T = TypeVar("T")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# Bodies the operator reads are objects, lists of a job's pods, Status answers: cap them.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
LIST_PAGE = 500  # objects per list request (client-go's pager uses the same)


@dataclass(frozen=True, slots=True)
class Resource:
    """A Kubernetes resource type: where its objects live on the API server."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name:
            parts.append(name)
            if subresource:
                parts.append(subresource)
        return "/".join(parts)


class KubeClient:
    """One aiohttp session to one API server. Not bound to kopf: tests give it any session."""

    def __init__(self, session: aiohttp.ClientSession, server: str, *, backoff: Backoff | None = None,
                 timeout_s: float = 30.0, field_manager: str = "frscope-operator",
                 auth: BearerAuth | None = None) -> None:
        self._session = session
        self._auth = auth
        self._server = server.rstrip("/")
        self._backoff = backoff or Backoff()
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._field_manager = field_manager

    @property
    def server(self) -> str:
        return self._server

    @property
    def backoff(self) -> Backoff:
        return self._backoff

    async def close(self) -> None:
        await self._session.close()

    async def _once(self, method: str, path: str, body: Any, params: Mapping[str, str] | None,
                    content_type: str | None) -> Any:
        headers = {"Accept": "application/json"}
        token = self._auth.token() if self._auth is not None else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data: bytes | None = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type or "application/json"
        try:
            async with self._session.request(method, self._server + path, data=data, params=params,
                                             headers=headers, timeout=self._timeout) as resp:
                raw = await read_capped(resp, MAX_RESPONSE_BYTES)
                if len(raw) > MAX_RESPONSE_BYTES:
                    raise TransportError(f"{method} {path}: answer larger than {MAX_RESPONSE_BYTES} bytes")
                decoded: Any
                try:
                    decoded = json.loads(raw) if raw else {}
                except ValueError:
                    decoded = raw.decode("utf-8", "replace")
                if resp.status >= 400:
                    raise error_for(resp.status, decoded, method=method, path=path,
                                    retry_after=resp.headers.get("Retry-After"))
                if not isinstance(decoded, dict):
                    raise TransportError(f"{method} {path}: answer is not a JSON object")
                return decoded
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise TransportError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def request(self, method: str, path: str, *, body: Any = None, params: Mapping[str, str] | None = None,
                      content_type: str | None = None) -> dict[str, Any]:
        """One API call; retried with backoff on transport errors, 429 (Retry-After) and 5xx."""

        async def once() -> dict[str, Any]:
            result: dict[str, Any] = await self._once(method, path, body, params, content_type)
            return result

        def again() -> Awaitable[dict[str, Any]]:
            return retrying(
                once,
                self._backoff,
                retry_if=lambda exc: isinstance(exc, KubeError) and exc.retryable,
                delay_hint=lambda exc: exc.retry_after_s if isinstance(exc, TooManyRequests) else None,
            )

        try:
            return await again()
        except Unauthorized:
            # The token expired or was rotated under us: read it again, and try once with the new one.
            if self._auth is None or not self._auth.reload():
                raise
            return await again()

    async def get(self, resource: Resource, namespace: str | None, name: str,
                  subresource: str | None = None) -> dict[str, Any]:
        return await self.request("GET", resource.path(namespace, name, subresource))

    async def pages(self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None,
                    field_selector: str | None = None) -> AsyncIterator[list[dict[str, Any]]]:
        """The objects one page (LIST_PAGE) at a time, for a caller that keeps only what it needs of each
        page (the raw objects of a 32,768-pod list are ~0.6 GiB parsed). An expired continue token (410)
        raises `Gone`: the caller starts over if it wants the rest."""
        params: dict[str, str] = {"limit": str(LIST_PAGE)}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        token = ""
        while True:
            page = {**params, "continue": token} if token else params
            answer = await self.request("GET", resource.path(namespace), params=page)
            meta = answer.get("metadata")
            token = str(meta.get("continue") or "") if isinstance(meta, dict) else ""
            items = [i for i in answer.get("items") or [] if isinstance(i, dict)]
            del answer, meta
            yield items
            del items
            if not token:
                return

    async def list(self, resource: Resource, namespace: str | None = None, *,
                   label_selector: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        """Every object, read in pages of LIST_PAGE (`limit`/`continue`): one answer for a job of 32,768 pods
        is past MAX_RESPONSE_BYTES. A continue token that expired (410) starts the list over, once."""
        for attempt in range(2):
            out: list[dict[str, Any]] = []
            try:
                async for page in self.pages(resource, namespace, label_selector=label_selector,
                                             field_selector=field_selector):
                    out.extend(page)
                return out
            except Gone:
                if attempt or not out:
                    raise
        return out

    async def create(self, resource: Resource, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", resource.path(namespace), body=body,
                                  params={"fieldManager": self._field_manager})

    async def replace(self, resource: Resource, namespace: str | None, name: str,
                      body: dict[str, Any]) -> dict[str, Any]:
        """PUT the whole object (its metadata.resourceVersion makes it conditional: 409 Conflict)."""
        return await self.request("PUT", resource.path(namespace, name), body=body,
                                  params={"fieldManager": self._field_manager})

    async def merge_patch(self, resource: Resource, namespace: str | None, name: str, patch: dict[str, Any],
                          subresource: str | None = None) -> dict[str, Any]:
        return await self.request("PATCH", resource.path(namespace, name, subresource), body=patch,
                                  params={"fieldManager": self._field_manager}, content_type=MERGE_PATCH)

    async def delete(self, resource: Resource, namespace: str | None, name: str, *,
                     uid: str | None = None) -> dict[str, Any]:
        """Delete one object; with `uid`, only that object (a newer one of the same name: 409 Conflict)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}} if uid else None
        return await self.request("DELETE", resource.path(namespace, name), body=body)

    async def server_version(self) -> tuple[int, int]:
        """(major, minor) of the API server, e.g. (1, 31) for 'v1.31.2' or minor '31+'."""
        answer = await self.request("GET", "/version")
        major = re.match(r"\d+", str(answer.get("major", "")))
        minor = re.match(r"\d+", str(answer.get("minor", "")))
        if not major or not minor:
            raise ApiError(200, "BadVersion", f"unreadable /version answer: {answer!r}")
        return int(major.group()), int(minor.group())


async def retry_on_conflict(fn: Callable[[], Awaitable[T]], backoff: Backoff | None = None) -> T:
    """Run a whole read-modify-write cycle again when the write hits 409 Conflict (not AlreadyExists)."""
    return await retrying(
        fn,
        backoff or Backoff(attempts=6, base_s=0.05, cap_s=2.0),
        retry_if=lambda exc: isinstance(exc, Conflict) and not isinstance(exc, AlreadyExists),
    )
