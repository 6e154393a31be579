"""What every route needs, kept on the aiohttp application under ``GATEWAY``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel

from shadowpod.domain.entries import check_session_id
from shadowpod.gateway.auth import Authenticator
from shadowpod.gateway.config import GatewayConfig
from shadowpod.gateway.errors import ApiError
from shadowpod.gateway.metrics import GatewayMetrics
from shadowpod.journal.store import JournalStore
from shadowpod.sessions.fence import ExchangeFence
from shadowpod.sessions.gates import SessionGates
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
    streams: set[asyncio.Task[Any]] = field(default_factory=set)

    def forget(self, session: str) -> None:
        self.gates.forget(session)
        self.auth.forget(session)
        self.firer.forget(session)


GATEWAY = web.AppKey("gateway", Gateway)


def gateway(request: web.Request) -> Gateway:
    return request.app[GATEWAY]


def session_of(request: web.Request) -> str:
    session = request.match_info["session"]
    try:
        return check_session_id(session)
    except ValueError as exc:
        raise ApiError(400, "InvalidSession", str(exc)) from None


def int_query(request: web.Request, name: str, default: int, *, minimum: int = 0) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(
            400, "InvalidQuery", f"query parameter {name!r} must be an integer, got {raw!r}"
        ) from None
    if value < minimum:
        raise ApiError(
            400, "InvalidQuery", f"query parameter {name!r} must be at least {minimum}, got {value}"
        )
    return value


def required_int_query(request: web.Request, name: str, *, minimum: int = 0) -> int:
    if name not in request.query:
        raise ApiError(400, "InvalidQuery", f"query parameter {name!r} is required")
    return int_query(request, name, minimum, minimum=minimum)


def float_query(request: web.Request, name: str, default: float, *, maximum: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ApiError(
            400, "InvalidQuery", f"query parameter {name!r} must be a number, got {raw!r}"
        ) from None
    if not 0 <= value <= maximum:
        raise ApiError(
            400, "InvalidQuery", f"query parameter {name!r} must be between 0 and {maximum}"
        )
    return value


def json_response(body: BaseModel | dict[str, Any] | list[Any], status: int = 200) -> web.Response:
    data = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
