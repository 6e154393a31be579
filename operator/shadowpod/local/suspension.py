"""Suspending and resuming a local session (``shadowpod suspend`` / ``resume``), as the
operator does a pod's: a final snapshot, the gateway's suspend (the owner's epoch
fenced, the next instance named and not started), the owner process stopped; on
resume, that instance started from the snapshot and the journal, and delivery opened
once it serves. A message to a suspended session wakes it (``WakeListener``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

import aiohttp

from shadowpod.api.models import SuspendRequest
from shadowpod.client.gateway import GatewayError
from shadowpod.engine.ports import InstanceSpec
from shadowpod.engine.record import InstanceRef
from shadowpod.local.deployment import LocalDeployment

logger = logging.getLogger(__name__)
# The longest a suspend waits for the owner's final snapshot (the journal would do).
SNAPSHOT_WAIT_S: Final = 30.0
FENCE_TIMEOUT_S: Final = 5.0
STOP_GRACE_S: Final = 5.0
WAKE_POLL_S: Final = 25.0


async def suspend(deployment: LocalDeployment, session: str, owner: InstanceRef) -> int | None:
    """Suspend ``session`` served by ``owner``; the final snapshot's watermark, if the
    owner wrote it in time. A ``GatewayError`` ``FenceTimeout``: the owner was busy
    past the fence timeout and still serves."""
    admin = deployment.admin
    requested = await admin.request_snapshot(session)
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    snapshot = None
    while time.monotonic() < deadline:
        latest = (await admin.status(session)).latest_snapshot
        if latest is not None and latest >= requested:
            snapshot = latest
            break
        await asyncio.sleep(0.1)
    ownership = await admin.ownership(session)
    request = SuspendRequest(
        expect_epoch=ownership.epoch,
        next_owner=deployment.next_name(session),
        timeout_s=FENCE_TIMEOUT_S,
    )
    await admin.suspend(session, request)
    await deployment.runtime.stop(owner.name, grace_s=STOP_GRACE_S)
    return snapshot


async def resume(deployment: LocalDeployment, session: str, image: str) -> InstanceRef:
    """Start the owner the suspension named; open delivery once it serves."""
    admin = deployment.admin
    ownership = await admin.ownership(session)
    assert ownership.owner is not None
    owner = InstanceRef(name=ownership.owner, image=image)
    spec = InstanceSpec(
        name=owner.name, image=image, session=session, mode="owner", epoch=ownership.epoch
    )
    await deployment.runtime.start(spec)
    await deployment.wait_serving(owner.name)
    await admin.resume(session, expect_epoch=ownership.epoch)
    return owner


class WakeListener:
    """One long-poll of the gateway's wake feed; ``wake`` is called for each session a
    message woke."""

    def __init__(self, deployment: LocalDeployment, wake: Callable[[str], Awaitable[None]]):
        self._deployment = deployment
        self._wake = wake
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="wake-listener")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _listen(self) -> None:
        cursor = 0
        while True:
            try:
                page = await self._deployment.admin.wakes(after=cursor, wait_s=WAKE_POLL_S)
            except (GatewayError, aiohttp.ClientError, TimeoutError) as exc:
                logger.warning("the gateway's wake feed did not answer (%s)", exc)
                await asyncio.sleep(1.0)
                continue
            for wake in page.wakes:
                try:
                    await self._wake(wake.session)
                except Exception:  # said; `shadowpod resume` is the way back
                    logger.exception("waking session %s failed", wake.session)
            cursor = page.cursor
