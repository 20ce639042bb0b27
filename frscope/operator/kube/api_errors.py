"""Kubernetes API failures as a typed tree, so callers say what they mean:

    KubeError
     +- TransportError          no HTTP answer (connection refused, reset, timeout)
     +- ApiError                an HTTP error status with the API server's Status object
         +- BadRequest (400)    +- Unauthorized (401)   +- Forbidden (403)   +- NotFound (404)
         +- Conflict (409)      +- AlreadyExists (409, reason AlreadyExists)
         +- Gone (410)          +- Invalid (422)        +- TooManyRequests (429)
         +- ServerError (5xx)

`retryable` says whether sending the same request again later can succeed: transport errors, 429
and 5xx. A 409 Conflict is retryable only after re-reading the object (see `retry_on_conflict`).
"""

from __future__ import annotations

from typing import Any


class KubeError(Exception):
    """Any failure to talk to the Kubernetes API."""

    retryable = False


class TransportError(KubeError):
    """The request got no HTTP answer."""

    retryable = True


class ApiError(KubeError):
    """The API server answered with an error status."""

    status: int = 0

    def __init__(self, status: int, reason: str, message: str, body: dict[str, Any] | None = None,
                 method: str = "", path: str = "") -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}
        self.method = method
        self.path = path
        where = f"{method} {path}: " if method else ""
        super().__init__(f"{where}{status} {reason}: {message}".rstrip(": "))


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Forbidden(ApiError):
    pass


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """Optimistic concurrency: the object changed since it was read (stale resourceVersion)."""


class AlreadyExists(Conflict):
    """A create for a name that is taken. Not retryable; for deterministic names, it means 'done'."""


class Gone(ApiError):
    pass


class Invalid(ApiError):
    pass


class TooManyRequests(ApiError):
    retryable = True

    def __init__(self, *args: Any, retry_after_s: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retry_after_s = retry_after_s


class ServerError(ApiError):
    retryable = True


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def error_for(status: int, body: Any, *, method: str = "", path: str = "",
              retry_after: str | None = None) -> ApiError:
    """The typed error for an HTTP error answer (`body` is the decoded Status object, if any)."""
    status_obj: dict[str, Any] = body if isinstance(body, dict) else {}
    reason = str(status_obj.get("reason") or "")
    message = str(status_obj.get("message") or (body if isinstance(body, str) else ""))[:2000]
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExists(status, reason, message, status_obj, method, path)
    if status == 429:
        delay: float | None = None
        if retry_after:
            try:
                delay = float(retry_after)
            except ValueError:
                delay = None
        return TooManyRequests(status, reason, message, status_obj, method, path, retry_after_s=delay)
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return cls(status, reason, message, status_obj, method, path)
