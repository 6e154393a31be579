"""What every route needs, kept on the aiohttp application under ``GATEWAY``."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import orjson
from aiohttp import web
from pydantic import BaseModel

from shadowpod.api.models import FieldError
from shadowpod.domain.bounds import INT64_MAX
from shadowpod.domain.entries import JournalEntry, check_session_id
from shadowpod.gateway.auth import Authenticator
from shadowpod.gateway.config import GatewayConfig
from shadowpod.gateway.errors import ApiError
from shadowpod.gateway.metrics import GatewayMetrics
from shadowpod.journal.store import JournalStore
from shadowpod.sessions.deletion import DeletedSessions
from shadowpod.sessions.fence import ExchangeFence
from shadowpod.sessions.gates import SessionGates
from shadowpod.sessions.lifecycle import SessionLifecycle
from shadowpod.sessions.schedules import ScheduleFirer

# How many bytes of encoded events a gateway keeps for its streams to share.
ENCODED_EVENTS_BYTES: Final = 32 * 1024 * 1024


class EncodedEvents:
    """Recently committed batches as their streams send them, encoded once for every
    stream of the session (``streams.py``). Keyed by session, seq range and the
    timestamps at its ends: what a range holds never changes while the session lives,
    and a session deleted and re-created under its name (here or in another gateway
    process) has other entries there, written at other times. A deleted session's are
    forgotten; the oldest go first past ``max_bytes``."""

    def __init__(self, max_bytes: int = ENCODED_EVENTS_BYTES) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._events: dict[tuple[str, int, int, datetime, datetime], bytes] = {}

    @staticmethod
    def _key(
        session: str, batch: Sequence[JournalEntry]
    ) -> tuple[str, int, int, datetime, datetime]:
        return (session, batch[0].seq, batch[-1].seq, batch[0].ts, batch[-1].ts)

    def get(self, session: str, batch: Sequence[JournalEntry]) -> bytes | None:
        return self._events.get(self._key(session, batch))

    def put(self, session: str, batch: Sequence[JournalEntry], data: bytes) -> None:
        key = self._key(session, batch)
        if key in self._events or len(data) > self._max_bytes:
            return
        self._events[key] = data
        self._bytes += len(data)
        while self._bytes > self._max_bytes:
            self._bytes -= len(self._events.pop(next(iter(self._events))))

    def forget(self, session: str) -> None:
        for key in [key for key in self._events if key[0] == session]:
            self._bytes -= len(self._events.pop(key))


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
    deletions: DeletedSessions
    streams: set[asyncio.Task[Any]] = field(default_factory=set)
    # The owner channels open per session: a deleted session's are closed, so that a
    # session re-created under its name is never fed to (or written by) the old owner.
    owner_channels: dict[str, set[asyncio.Task[Any]]] = field(default_factory=dict)
    # Event streams (SSE) open, per session: bounded per session and in all.
    event_streams: Counter[str] = field(default_factory=Counter)
    encoded_events: EncodedEvents = field(default_factory=EncodedEvents)
    # Whether this process serves the session now (``placement.py``: it holds the
    # session's lease and trusts it still); one process alone serves every session.
    serves: Callable[[str], bool] = field(default=lambda _session: True)

    def forget(self, session: str) -> None:
        """Drop what this gateway keeps of a deleted session, and end its channels."""
        self.gates.forget(session)
        self.auth.forget(session)
        self.firer.forget(session)
        self.encoded_events.forget(session)
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
