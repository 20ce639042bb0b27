"""The operator's Kubernetes API client: typed resources, typed errors, retries with backoff, rotating tokens."""

from frscope.operator.kube.backoff import Backoff, retrying
from frscope.operator.kube.client import JSON_PATCH, MERGE_PATCH, KubeClient, Resource, retry_on_conflict
from frscope.operator.kube.credentials import BearerAuth, StaticToken, TokenFile
from frscope.operator.kube.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    ServerError,
    TooManyRequests,
    TransportError,
    Unauthorized,
    error_for,
)
from frscope.operator.kube.resources import (
    EVENTS,
    PODS,
    PYTORCHJOBS,
    REPORTS,
    SUBJECTACCESSREVIEWS,
    TOKENREVIEWS,
)

__all__ = [
    "EVENTS",
    "JSON_PATCH",
    "MERGE_PATCH",
    "PODS",
    "PYTORCHJOBS",
    "REPORTS",
    "SUBJECTACCESSREVIEWS",
    "TOKENREVIEWS",
    "AlreadyExists",
    "ApiError",
    "Backoff",
    "BearerAuth",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeClient",
    "KubeError",
    "NotFound",
    "Resource",
    "ServerError",
    "StaticToken",
    "TokenFile",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "error_for",
    "retry_on_conflict",
    "retrying",
]
