"""What every route needs, kept on the aiohttp application under ``GATEWAY``."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from aiohttp import web
from pydantic import BaseModel

from shadowpod.api.models import FieldError
from shadowpod.domain.bounds import INT64_MAX
from shadowpod.domain.entries import check_session_id
from shadowpod.gateway.auth import Authenticator
from shadowpod.gateway.config import GatewayConfig
from shadowpod.gateway.errors import ApiError
from shadowpod.gateway.metrics import GatewayMetrics
from shadowpod.journal.store import JournalStore
from shadowpod.sessions.fence import ExchangeFence
from shadowpod.sessions.gates import SessionGates
from shadowpod.sessions.lifecycle import SessionLifecycle
from shadowpod.sessions.schedules import ScheduleFirer


@dataclass
class Gateway:
    config: GatewayConfig
    store: JournalStore
    auth: Authenticator
    gates: SessionGates
    fence: ExchangeFence
    firer: ScheduleFirer
    metrics: GatewayMetrics
    lifecycle: SessionLifecycle
    streams: set[asyncio.Task[Any]] = field(default_factory=set)
    # The owner channels open per session: a deleted session's are closed, so that a
    # session re-created under its name is never fed to (or written by) the old owner.
    owner_channels: dict[str, set[asyncio.Task[Any]]] = field(default_factory=dict)
    # Event streams (SSE) open, per session: bounded per session and in all.
    event_streams: Counter[str] = field(default_factory=Counter)

    def forget(self, session: str) -> None:
        """Drop what this gateway keeps of a deleted session, and end its channels."""
        self.gates.forget(session)
        self.auth.forget(session)
        self.firer.forget(session)
        for task in self.owner_channels.pop(session, set()):
            task.cancel()


GATEWAY = web.AppKey("gateway", Gateway)


def gateway(request: web.Request) -> Gateway:
    return request.app[GATEWAY]


def session_of(request: web.Request) -> str:
    session = request.match_info["session"]
    try:
        return check_session_id(session)
    except ValueError as exc:
        raise ApiError(400, "InvalidSession", str(exc)) from None


def parse_int(raw: str, name: str, *, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """``raw`` as an integer from ``minimum`` to ``maximum``: ASCII digits only (no sign,
    space, ``_`` or other scripts' digits, which ``int()`` would take), or a 400 naming
    ``name``."""
    if not (raw.isascii() and raw.isdigit()):
        raise invalid_value(name, f"must be an integer (ASCII digits), got {raw[:40]!r}")
    value = int(raw) if len(raw) <= 20 else maximum + 1
    if value < minimum:
        raise invalid_value(name, f"must be at least {minimum}, got {value}")
    if value > maximum:
        raise invalid_value(name, f"must be at most {maximum}, got {raw[:40]}")
    return value


def invalid_value(name: str, problem: str) -> ApiError:
    return ApiError(
        400,
        "InvalidQuery",
        f"query parameter {name!r} {problem}",
        [FieldError(loc=name, msg=problem)],
    )


def int_query(
    request: web.Request, name: str, default: int, *, minimum: int = 0, maximum: int = INT64_MAX
) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    return parse_int(raw, name, minimum=minimum, maximum=maximum)


def required_int_query(
    request: web.Request, name: str, *, minimum: int = 0, maximum: int = INT64_MAX
) -> int:
    if name not in request.query:
        raise invalid_value(name, "is required")
    return int_query(request, name, minimum, minimum=minimum, maximum=maximum)


# A decimal number: no "nan", "inf", exponent, sign or other scripts' digits.
_DECIMAL: Final = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")


def float_query(request: web.Request, name: str, default: float, *, maximum: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not _DECIMAL.fullmatch(raw):
        raise invalid_value(name, f"must be a number of seconds like 2.5, got {raw[:40]!r}")
    value = float(raw)
    if not 0 <= value <= maximum:
        raise invalid_value(name, f"must be between 0 and {maximum}, got {raw}")
    return value


def json_response(body: BaseModel | dict[str, Any] | list[Any], status: int = 200) -> web.Response:
    data = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
