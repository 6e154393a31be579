"""``GatewayControl``: the engine's ``SessionControl`` port over the gateway's HTTP API.

Connection errors are retried briefly (a gateway restart should not fail a
migration); answers the gateway gives on purpose are mapped to the engine's errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import aiohttp

from shadowpod.api.models import FenceRequest, OwnershipChange
from shadowpod.client.gateway import GatewayClient, GatewayError
from shadowpod.domain.ownership import Ownership
from shadowpod.engine.ports import (
    FenceOutcome,
    FenceOutcomeUnknown,
    FencePause,
    FenceTimedOut,
    GatewayUnavailable,
)

T = TypeVar("T")
RETRIES: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.0, 2.0)


class GatewayControl:
    def __init__(self, client: GatewayClient) -> None:
        self.client = client

    async def retry(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call``, asked again while the gateway is away (for ~10 s); then
        ``GatewayUnavailable``, which the engine retries up to its phase timeout."""
        delays = iter(RETRIES)
        while True:
            try:
                return await call()
            except (aiohttp.ClientError, TimeoutError) as exc:
                failure = f"no answer from the gateway: {str(exc) or type(exc).__name__}"
            except GatewayError as exc:
                if exc.status != 503:
                    raise
                failure = f"the gateway is not ready: {exc.message}"
            delay = next(delays, None)
            if delay is None:
                raise GatewayUnavailable(failure)
            await asyncio.sleep(delay)

    async def head(self, session: str) -> int:
        return (await self.retry(lambda: self.client.status(session))).head

    async def ownership(self, session: str) -> Ownership:
        return await self.retry(lambda: self.client.ownership(session))

    async def request_snapshot(self, session: str) -> int:
        return await self.retry(lambda: self.client.request_snapshot(session))

    async def latest_snapshot(self, session: str) -> int | None:
        infos = await self.retry(lambda: self.client.snapshots(session))
        return infos[-1].watermark if infos else None

    async def fence(
        self, session: str, *, expect_epoch: int, new_owner: str, timeout_s: float
    ) -> FenceOutcome:
        request = FenceRequest(expect_epoch=expect_epoch, new_owner=new_owner, timeout_s=timeout_s)
        try:
            result = await self.client.fence(session, request)
        except GatewayError as exc:
            if exc.reason == "FenceTimeout":
                raise FenceTimedOut(exc.message) from None
            if exc.status == 503:  # not serving yet: nothing was done, so it is safe to ask again
                raise FenceOutcomeUnknown(f"the gateway is not ready: {exc.message}") from None
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Not retried here: the exchange may have committed. The engine reads the
            # ownership to find out before it tries again.
            detail = str(exc) or type(exc).__name__
            raise FenceOutcomeUnknown(f"no answer from the gateway: {detail}") from None
        return FenceOutcome(
            epoch=result.epoch, fence_seq=result.fence_seq, waited_ms=result.waited_ms
        )

    async def unfence(self, session: str, *, expect_epoch: int) -> None:
        await self.retry(lambda: self.client.unfence(session, expect_epoch=expect_epoch))

    async def set_owner(
        self, session: str, *, expect_epoch: int, epoch: int, owner: str
    ) -> Ownership:
        change = OwnershipChange(expect_epoch=expect_epoch, epoch=epoch, owner=owner)
        return await self.retry(lambda: self.client.set_ownership(session, change))

    async def fence_pause(self, session: str) -> FencePause:
        status = await self.retry(lambda: self.client.status(session))
        return FencePause(ms=status.last_fence_pause_ms, pending=status.fence_pause_pending)
