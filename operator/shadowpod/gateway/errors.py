"""Every error answer is JSON: ``{"reason": ..., "message": ..., "errors": [...]}``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from shadowpod.api.models import ErrorBody, FieldError
from shadowpod.domain.errors import SchemaTooNew, ShadowpodError
from shadowpod.journal.errors import (
    EpochConflict,
    Fenced,
    IdempotencyConflict,
    InvalidForkPoint,
    InvalidOwnership,
    InvalidSnapshot,
    InvalidTurn,
    JournalTruncated,
    OwnerMismatch,
    SessionExists,
    SessionHasForks,
    SessionNotFound,
    SnapshotNotFound,
    StoreFull,
    StoreUnavailable,
)
from shadowpod.sessions.fence import FenceTimeout
from shadowpod.sessions.lifecycle import NotSuspended

logger = logging.getLogger(__name__)


class Limits(BaseModel):
    max_body_bytes: int
    max_snapshot_bytes: int
    body_timeout_s: float = 300.0
    body_idle_timeout_s: float = 15.0
    # The largest body each route takes, by route name (0: the route takes none).
    routes: dict[str, int] = Field(default_factory=dict)


# Bodies of control requests (an ownership change, a fence, an ack) are a few fields.
CONTROL_BODY_BYTES: Final = 16 * 1024

# Kept apart from the gateway context so this middleware needs nothing else.
LIMITS = web.AppKey("limits", Limits)


class StoreHealth:
    """When the store last said it was full: the gateway reports itself not ready for
    a while after (``/readyz``), so that traffic goes to a replica that can write."""

    NOT_READY_S: Final = 10.0

    def __init__(self) -> None:
        self.full_until = 0.0

    def full(self) -> None:
        self.full_until = time.monotonic() + self.NOT_READY_S

    def is_full(self) -> bool:
        return time.monotonic() < self.full_until


STORE_HEALTH = web.AppKey("store_health", StoreHealth)
# What a 503 tells a client to wait before retrying (the store is away or full).
RETRY_AFTER_S: Final = 5
# The body limit of the route a request was routed to (set by ``body_limits``).
BODY_LIMIT: Final = web.RequestKey("body_limit", int)
M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

STATUS_OF: Final[dict[type[ShadowpodError], int]] = {
    SessionNotFound: 404,
    SnapshotNotFound: 404,
    SessionExists: 409,
    Fenced: 409,
    OwnerMismatch: 409,
    IdempotencyConflict: 409,
    EpochConflict: 409,
    FenceTimeout: 409,
    NotSuspended: 409,
    SessionHasForks: 409,
    InvalidForkPoint: 409,
    # A well-formed request the session's current state refuses (its epoch and owner,
    # its journal's head): the same request succeeds in another state, so a conflict,
    # not a malformed request (OpenAPI's and schemathesis's reading of 400 and 409).
    InvalidOwnership: 409,
    InvalidTurn: 409,
    InvalidSnapshot: 400,
    JournalTruncated: 410,
    SchemaTooNew: 409,
    StoreUnavailable: 503,
}


def status_of(exc: ShadowpodError) -> int:
    """The status of ``exc``'s nearest class in ``STATUS_OF`` (a subclass answers as
    its family does), else 400 for a value error and 500 for anything else."""
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return 400 if isinstance(exc, ValueError) else 500


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


# The status of a request whose client hung up before it was answered (nginx's).
CLIENT_CLOSED: Final = 499
# Bodies larger than this (snapshots) are parsed off the event loop.
LARGE_BODY: Final = 256 * 1024


def too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        "TooLarge",
        f"the request body is larger than the {limit} bytes this route allows",
    )


def body_timeout(read: int, limits: Limits) -> ApiError:
    return ApiError(
        408,
        "BodyTimeout",
        f"the request body came too slowly ({read} bytes read): a body must be sent "
        f"within {limits.body_timeout_s:g} s, with no pause over "
        f"{limits.body_idle_timeout_s:g} s",
    )


async def read_body_pieces(
    request: web.Request, *, limit: int | None = None
) -> AsyncIterator[bytes]:
    """The request body, piece by piece as it streams in: a 413 as soon as it is larger
    than ``limit`` (by default the route's limit, else the gateway's body limit),
    nothing more is read; a 408 when it comes too slowly."""
    limits = request.app[LIMITS]
    if limit is None:
        limit = request.get(BODY_LIMIT, limits.max_body_bytes)
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.body_timeout_s
    read = 0
    while True:
        wait = min(limits.body_idle_timeout_s, deadline - loop.time())
        try:
            if wait <= 0:
                raise TimeoutError
            async with asyncio.timeout(wait):
                chunk = await request.content.readany()
        except TimeoutError:
            raise body_timeout(read, limits) from None
        except ConnectionError:
            # The client hung up mid-body: its doing, not the server's. Nobody reads
            # the answer; its status (nginx's 499) keeps it out of the 5xx counts.
            raise ApiError(
                CLIENT_CLOSED, "ClientClosedRequest", f"the client left after {read} bytes"
            ) from None
        if not chunk:
            return
        read += len(chunk)
        if read > limit:
            raise too_large(limit)
        yield chunk


async def read_raw_body(request: web.Request, *, limit: int | None = None) -> bytes:
    """The request body, read whole as it streams in (``read_body_pieces``)."""
    body = bytearray()
    async for chunk in read_body_pieces(request, limit=limit):
        body += chunk
    return bytes(body)


def parse_body(raw: bytes, model: type[M]) -> M:
    """``raw`` (JSON) as ``model``, or a 400 naming every field that is wrong."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "MalformedJSON", f"the request body is not valid JSON: {exc}") from None
    return validate_body(data, model)


def validate_body(data: object, model: type[M]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = field_errors(exc)
        summary = "; ".join(f"{e.loc}: {e.msg}" for e in errors[:5])
        raise ApiError(
            400, "InvalidRequest", f"the request body is invalid: {summary}", errors
        ) from None


async def read_body(request: web.Request, model: type[M], *, limit: int | None = None) -> M:
    """The request body as ``model``, or a 400 naming every field that is wrong (413
    when it is larger than ``limit``, by default the route's limit)."""
    raw = await read_raw_body(request, limit=limit)
    if len(raw) <= LARGE_BODY:
        return parse_body(raw, model)
    try:
        data = await asyncio.to_thread(orjson.loads, raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "MalformedJSON", f"the request body is not valid JSON: {exc}") from None
    return validate_body(data, model)


@web.middleware
async def body_limits(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a body declared larger than the route allows before the route does any
    work (authentication included); a streamed one is refused as soon as it is
    (``read_raw_body``)."""
    name = request.match_info.route.name
    limit = request.app[LIMITS].routes.get(name) if name else None
    if limit:  # a route that takes no body never reads one (aiohttp drops it, LINGER_S)
        request[BODY_LIMIT] = limit
        declared = request.content_length
        if declared is not None and declared > limit:
            raise too_large(limit)
    return await handler(request)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        response = error_response(exc.status, exc.reason, str(exc), exc.errors)
        if exc.status == 503:
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response
    except StoreUnavailable as exc:
        if isinstance(exc, StoreFull):
            request.app[STORE_HEALTH].full()
        response = error_response(503, exc.reason, str(exc))
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response
    except ShadowpodError as exc:
        status = status_of(exc)
        return error_response(status, exc.reason, str(exc))
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, "TooLarge", str(too_large(request.app[LIMITS].max_body_bytes)))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = exc.reason.replace(" ", "")
        message = http_error_message(request, exc)
        response = error_response(exc.status, reason, message)
        if "Allow" in exc.headers:  # 405: the methods the route takes
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except Exception:
        logger.exception("unexpected error in %s %s", request.method, request.path)
        return error_response(
            500, "InternalError", "an unexpected error occurred; see the gateway log"
        )


def http_error_message(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"no route {request.path!r}: see openapi.yaml for the gateway's routes"
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        return f"{request.method} is not allowed on {request.path!r}; allowed: {allowed}"
    return exc.text or exc.reason
