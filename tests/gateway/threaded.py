"""A real gateway on its own event loop and thread, for synchronous callers
(schemathesis, hypothesis state machines)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from shadowpod.api.models import CreateSession, OwnershipChange
from shadowpod.client.gateway import GatewayClient
from shadowpod.gateway.app import make_app, make_runner
from tests.gateway.conftest import CONTROL, gateway_config


class Gateway:
    """A gateway (``make_app`` served by its runner) on its own event loop and thread:
    schemathesis calls it synchronously."""

    def __init__(self, journal: Path, session: str, **config: Any) -> None:
        self.url = ""
        self.agent_token = ""
        self.session = session
        self._journal = journal
        self._config = config
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Gateway:
        self._thread.start()
        assert self._ready.wait(10), "the gateway did not start"
        return self

    def __exit__(self, *_: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        config = gateway_config(self._journal, **self._config)
        runner = make_runner(make_app(config))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        async with GatewayClient(self.url, CONTROL) as control:
            created = await control.create_session(CreateSession(session=self.session))
            await control.set_ownership(
                self.session, OwnershipChange(expect_epoch=0, epoch=1, owner="pod-a")
            )
            await control.post_message(self.session, "hello")
        self.agent_token = created.agent_token
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
