"""Waking suspended sessions when a message comes: one long-poll to the gateway's wake
feed for every session (``GET /v1/wakes``), each wake reconciled at once.

The feed is the quick path, not the record: a wake is durable in the gateway's
ownership record (``waking``), which every session's periodic pass reads, so a wake
this listener missed (an operator or gateway restart, another gateway replica) is
still served, a pass later.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import aiohttp

from shadowpod.client.gateway import GatewayError
from shadowpod.domain.errors import ShadowpodError
from shadowpod.kube import sessions
from shadowpod.kube.context import OperatorContext

logger = logging.getLogger("shadowpod.operator")

# How long one long-poll waits for a wake (the gateway caps it at its max_wait_s).
WAIT_S: Final = 25.0
# The pause after a gateway that did not answer.
RETRY_S: Final = 2.0


async def listen(ctx: OperatorContext) -> None:
    """Until cancelled: every wake the gateway publishes, its session reconciled."""
    cursor = 0
    while True:
        try:
            page = await ctx.admin.wakes(after=cursor, wait_s=WAIT_S)
        except (GatewayError, aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("the gateway's wake feed did not answer (%s): asking again", exc)
            await asyncio.sleep(RETRY_S)
            continue
        for wake in page.wakes:
            # A session's gateway id is "<namespace>.<name>" (names.gateway_session).
            namespace, _, name = wake.session.partition(".")
            if ctx.config.namespaces and namespace not in ctx.config.namespaces:
                continue
            logger.info("a message wakes session %s/%s", namespace, name)
            try:
                await sessions.reconcile_named(ctx, namespace, name)
            except (ShadowpodError, aiohttp.ClientError, TimeoutError) as exc:
                # Its periodic pass resumes it: the wake is in the ownership record.
                logger.warning("waking %s/%s failed (%s)", namespace, name, exc)
        cursor = page.cursor
