"""A real gateway over real HTTP: an aiohttp ``TestServer`` on 127.0.0.1 serving
``make_app`` on a SQLite journal in the test's temporary directory."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from shadowpod.api.models import CreateSession, OwnershipChange
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.gateway.app import make_app, make_runner
from shadowpod.gateway.config import GatewayConfig
from shadowpod.gateway.context import GATEWAY, Gateway
from shadowpod.sessions.tokens import token_hash

CONTROL = "control-token-for-tests"
SESSION = "chat-1"


@dataclass
class RunningGateway:
    server: TestServer
    app: web.Application
    config: GatewayConfig
    url: str

    @property
    def gw(self) -> Gateway:
        return self.app[GATEWAY]

    async def stop(self) -> None:
        await self.server.close()


StartGateway = Callable[..., Awaitable[RunningGateway]]


@dataclass
class Reply:
    """An HTTP answer, read whole: status, headers and the body as JSON (or text)."""

    status: int
    headers: Mapping[str, str]
    text: str

    @property
    def json(self) -> Any:
        return orjson.loads(self.text)

    @property
    def reason(self) -> str:
        reason: str = self.json["reason"]
        return reason

    @property
    def locs(self) -> list[str]:
        return [error["loc"] for error in self.json["errors"]]


@dataclass
class Session:
    name: str
    agent_token: str


def gateway_config(journal: Path, **overrides: Any) -> GatewayConfig:
    """The SQLite journal at ``journal`` unless ``overrides`` name a ``journal_url``."""
    settings: dict[str, Any] = {
        "journal_url": f"sqlite:///{journal}",
        "control_token_hashes": frozenset({token_hash(CONTROL)}),
        "port": 0,
    }
    return GatewayConfig(**(settings | overrides))


class GatewayTestServer(TestServer):
    """A ``TestServer`` that serves the app as ``shadowpod gateway`` does (its runner)."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        # aiohttp's test server cancels a handler whose client left; the gateway's
        # server does not (a handler learns it when it writes): tests see the latter.
        kwargs.pop("handler_cancellation", None)
        return make_runner(self.app, **kwargs)


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "j.db"


@pytest.fixture
async def start_gateway(journal_path: Path) -> AsyncIterator[StartGateway]:
    """Starts a gateway on ``journal_path`` with config overrides; all are stopped at the end."""
    started: list[RunningGateway] = []

    async def start(**overrides: Any) -> RunningGateway:
        config = gateway_config(journal_path, **overrides)
        app = make_app(config)
        server = GatewayTestServer(app, host="127.0.0.1")
        await server.start_server()
        running = RunningGateway(server, app, config, str(server.make_url("")).rstrip("/"))
        started.append(running)
        return running

    yield start
    for running in reversed(started):
        await running.stop()


@pytest.fixture
async def gateway(start_gateway: StartGateway) -> RunningGateway:
    return await start_gateway()


@pytest.fixture
def url(gateway: RunningGateway) -> str:
    return gateway.url


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


@pytest.fixture
async def control(url: str) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(url, CONTROL, timeout_s=10) as client:
        yield client


@pytest.fixture
async def session(control: GatewayClient) -> Session:
    created = await control.create_session(CreateSession(session=SESSION))
    return Session(created.session, created.agent_token)


@pytest.fixture
async def owned(control: GatewayClient, session: Session) -> Session:
    """The session with an owner at epoch 1."""
    await control.set_ownership(
        session.name, OwnershipChange(expect_epoch=0, epoch=1, owner="pod-a")
    )
    return session


@pytest.fixture
async def agent(url: str, session: Session) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(url, session.agent_token, timeout_s=10) as client:
        yield client


@pytest.fixture
async def client(url: str) -> AsyncIterator[GatewayClient]:
    """A client without a token: the gateway was given no client tokens."""
    async with GatewayClient(url, timeout_s=10) as client:
        yield client


async def call(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    token: str | None = None,
    json: Any = None,
    data: bytes | str | None = None,
    params: Mapping[str, str | int | float] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """One request with an optional bearer token; the answer read whole."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    if json is not None:
        data = orjson.dumps(json)
        sent["Content-Type"] = "application/json"
    async with http.request(method, url, data=data, params=params, headers=sent) as response:
        return Reply(response.status, response.headers, await response.text())


@asynccontextmanager
async def closing(
    stream: AsyncIterator[list[JournalEntry]],
) -> AsyncIterator[AsyncIterator[list[JournalEntry]]]:
    """Close an entry stream (an async generator: its HTTP response) when done with it."""
    try:
        yield stream
    finally:
        assert isinstance(stream, AsyncGenerator)
        await stream.aclose()


def reply(turn: int, content: str) -> NewEntry:
    """An owner's answer in the turn of inbound entry ``turn``."""
    return NewEntry(kind="message", payload={"role": "assistant", "content": content, "turn": turn})


def ack(turn: int) -> NewEntry:
    return NewEntry(kind="ack", payload={"turn": turn})
