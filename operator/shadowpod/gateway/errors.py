"""Every error answer is JSON: ``{"reason": ..., "message": ..., "errors": [...]}``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from shadowpod.api.models import ErrorBody, FieldError
from shadowpod.domain.errors import SchemaTooNew, ShadowpodError
from shadowpod.journal.errors import (
    EpochConflict,
    Fenced,
    InvalidOwnership,
    InvalidSnapshot,
    JournalTruncated,
    SessionExists,
    SessionNotFound,
    SnapshotNotFound,
    StoreUnavailable,
)
from shadowpod.sessions.fence import FenceTimeout

logger = logging.getLogger(__name__)


class Limits(BaseModel):
    max_body_bytes: int
    max_snapshot_bytes: int


# Kept apart from the gateway context so this middleware needs nothing else.
LIMITS = web.AppKey("limits", Limits)
M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

STATUS_OF: Final[dict[type[ShadowpodError], int]] = {
    SessionNotFound: 404,
    SnapshotNotFound: 404,
    SessionExists: 409,
    Fenced: 409,
    EpochConflict: 409,
    FenceTimeout: 409,
    InvalidOwnership: 400,
    InvalidSnapshot: 400,
    JournalTruncated: 410,
    SchemaTooNew: 409,
    StoreUnavailable: 503,
}


def error_response(
    status: int, reason: str, message: str, errors: list[FieldError] | None = None
) -> web.Response:
    body = ErrorBody(reason=reason, message=message, errors=errors or [])
    response = web.json_response(body.model_dump(), status=status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="shadowpod"'
    return response


class ApiError(Exception):
    """An error a route raises on purpose, with its HTTP status."""

    def __init__(
        self, status: int, reason: str, message: str, errors: list[FieldError] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.errors = errors or []


def field_errors(exc: ValidationError, prefix: str = "") -> list[FieldError]:
    errors = []
    for error in exc.errors():
        loc = ".".join(str(part) for part in error["loc"])
        errors.append(
            FieldError(loc=f"{prefix}{loc}" if loc else prefix.rstrip("."), msg=error["msg"])
        )
    return errors


# Bodies larger than this (snapshots) are parsed off the event loop.
LARGE_BODY: Final = 256 * 1024


async def read_raw_body(request: web.Request, *, limit: int | None = None) -> bytes:
    """The request body, or a 413 when it is larger than ``limit`` (by default the
    gateway's body limit)."""
    limit = request.app[LIMITS].max_body_bytes if limit is None else limit
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(
            413, "TooLarge", f"the request body is larger than the {limit} bytes allowed"
        )
    raw = await request.read()
    if len(raw) > limit:
        raise ApiError(
            413, "TooLarge", f"the request body is larger than the {limit} bytes allowed"
        )
    return raw


async def read_body(request: web.Request, model: type[M], *, limit: int | None = None) -> M:
    """The request body as ``model``, or a 400 naming every field that is wrong (413
    when it is larger than ``limit``, by default the gateway's body limit)."""
    raw = await read_raw_body(request, limit=limit)
    try:
        data = (
            await asyncio.to_thread(orjson.loads, raw)
            if len(raw) > LARGE_BODY
            else orjson.loads(raw)
        )
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "MalformedJSON", f"the request body is not valid JSON: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = field_errors(exc)
        summary = "; ".join(f"{e.loc}: {e.msg}" for e in errors[:5])
        raise ApiError(
            400, "InvalidRequest", f"the request body is invalid: {summary}", errors
        ) from None


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.reason, str(exc), exc.errors)
    except ShadowpodError as exc:
        status = STATUS_OF.get(type(exc), 400 if isinstance(exc, ValueError) else 500)
        return error_response(status, exc.reason, str(exc))
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[LIMITS].max_snapshot_bytes
        return error_response(
            413, "TooLarge", f"the request body is larger than the {limit} bytes allowed"
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = exc.reason.replace(" ", "")
        return error_response(exc.status, reason, exc.text or exc.reason)
    except Exception:
        logger.exception("unexpected error in %s %s", request.method, request.path)
        return error_response(
            500, "InternalError", "an unexpected error occurred; see the gateway log"
        )
