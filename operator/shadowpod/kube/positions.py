"""The operator's periodic look at every session, at a cost that does not grow with them.

A steady session (its owner ready, nothing degraded, no migration, no idle timer) has
no periodic pass of its own: what changes it arrives as a watch event (its spec, its
owner pod, a node cordoned, its migration's end) or from the gateway's wake feed.
What the watches cannot show is the gateway's side: the journal's head and acked
turn, an epoch or fence state changed behind the operator's back. So every
``reconcile_interval_s`` one request (``GET /v1/positions``) reads every session's
position, and it is compared with each session's status as the watch last delivered
it (no API read):

- the journal figures moved: only ``status.journal`` is written (one patch per
  session that changed, none for the others);
- the epoch or the fence state disagree with the status (a wake, an ownership
  changed elsewhere), or the gateway has no such session: a full pass.

Why one batch read and not a change feed: the positions are level values read from
the shared journal, so the answer is the same from every gateway replica and after
any restart (a feed kept in one replica's memory misses what another served, and
what happened while the operator was away), and a missed period is repaired by the
next with no cursor to keep. It costs one statement and ~60 bytes per session per
period: 0.6 MB every 30 s at 10,000 sessions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from shadowpod.api.models import SessionPosition
from shadowpod.client.gateway import GatewayError
from shadowpod.domain.errors import ShadowpodError
from shadowpod.kube import names, sessions
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.models.v1alpha1 import JournalStatus

logger = logging.getLogger("shadowpod.operator")

# Sessions written to or passed over at once by one look.
CONCURRENCY: Final = 16
SUSPENDED_FENCES: Final = frozenset({"suspended", "waking"})


@dataclass(frozen=True)
class Differences:
    """What one look found: journal figures to write, sessions to pass over."""

    journals: dict[tuple[str, str], JournalStatus]
    passes: list[tuple[str, str]]


def differences(
    watched: Mapping[tuple[str, str], Mapping[str, Any]], positions: list[SessionPosition]
) -> Differences:
    """Each watched session's status (``(namespace, name) -> status``) against the
    gateway's positions."""
    by_id = {p.session: p for p in positions}
    journals: dict[tuple[str, str], JournalStatus] = {}
    passes: list[tuple[str, str]] = []
    for key, status in watched.items():
        if status.get("epoch") is None:
            continue  # not made yet: its own passes run until it is
        position = by_id.get(names.gateway_session(*key))
        if position is None or position.epoch != status["epoch"]:
            passes.append(key)
            continue
        suspended = status.get("phase") == "Suspended"
        if position.fence == "waking" or suspended != (position.fence in SUSPENDED_FENCES):
            passes.append(key)
            continue
        journal = status.get("journal") or {}
        if (journal.get("headSeq"), journal.get("ackedSeq")) != (position.head, position.acked):
            journals[key] = JournalStatus(head_seq=position.head, acked_seq=position.acked)
    return Differences(journals, passes)


async def look(ctx: OperatorContext) -> Differences:
    """One look: the gateway's positions read, the differences acted on."""
    positions = (await ctx.admin.positions()).sessions
    found = differences(dict(ctx.watched_sessions), positions)
    limit = asyncio.Semaphore(CONCURRENCY)

    async def journal(key: tuple[str, str], figures: JournalStatus) -> None:
        async with limit:
            await sessions.refresh_journal(ctx, *key, figures)

    async def full(key: tuple[str, str]) -> None:
        async with limit:
            await sessions.reconcile_named(ctx, *key)

    results = await asyncio.gather(
        *(journal(k, f) for k, f in found.journals.items()),
        *(full(k) for k in found.passes),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, Exception):
            logger.warning("a session's refresh from the gateway's positions failed: %s", result)
    return found


async def run(ctx: OperatorContext) -> None:
    """Until cancelled: one look every ``reconcile_interval_s``."""
    while True:
        await asyncio.sleep(ctx.config.reconcile_interval_s)
        try:
            await look(ctx)
        except (ShadowpodError, GatewayError, aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("the gateway's session positions did not come (%s)", exc)
