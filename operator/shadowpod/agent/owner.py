"""An agent runtime as the session's owner: adopting the session, taking turns,
journaling their outputs at its epoch.

``OwnerLoop`` is one owner phase of an agent process: the runtime
(``shadowpod.agent.runtime``) makes one when it starts owning the session (again, after
a restore from a checkpoint) and lends it what it holds through ``OwnerHost``: the
folded journal, the epoch, the connection to the gateway. The loop keeps what only
owning needs: the owner channel, how far the gateway released work and the journal
came back, whether the session is adopted. An owner processes the lowest pending
inbound entry the gateway released to it, journals the turn's outputs and ack in one
append (quick turns queued behind each other share one), and takes the next turn only
once the journal has come back past that ack — so every turn sees exactly the state
the journal says it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Final, Protocol

import aiohttp

from shadowpod.agent.adoption import adoption_entries
from shadowpod.agent.appends import AppendLimits, WriteRefused, permanent, plan_appends
from shadowpod.agent.declaration import AgentDeclaration
from shadowpod.agent.identity import Identity
from shadowpod.agent.processes import ProcessRegistry
from shadowpod.agent.promotion import Promotion
from shadowpod.agent.turn import OwnerContext, Superseded, ToolAbandoned, Turn
from shadowpod.agent.turn_group import TurnGroup
from shadowpod.client.channel import ChannelClosed, OwnerChannelClient
from shadowpod.client.gateway import GatewayClient, GatewayError
from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.domain.payloads import AckPayload
from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.state import PendingInbound, SessionState

logger = logging.getLogger(__name__)
OWNER_WAIT_S: Final = 20.0
APPEND_RETRY_S: Final = 60.0
TRANSIENT: Final = (aiohttp.ClientError, asyncio.TimeoutError)


class OwnerHost(Protocol):
    """What an owner loop reads of the process that hosts it, and the two things it
    reports back (``serving``, ``turns``: the agent's status shows them)."""

    serving: bool  # owner at its epoch, adopted, and the gateway took its writes
    turns: int  # turns taken by this process, every phase

    @property
    def agent(self) -> AgentDeclaration: ...
    @property
    def identity(self) -> Identity: ...
    @property
    def session(self) -> str: ...
    @property
    def client(self) -> GatewayClient: ...
    @property
    def folder(self) -> StateFolder: ...
    @property
    def processes(self) -> ProcessRegistry: ...
    @property
    def limits(self) -> AppendLimits: ...
    @property
    def epoch(self) -> int: ...
    @property
    def promotion(self) -> Promotion | None:
        """Set when this process became owner through an ExchangeFence as a shadow."""

    @property
    def stopping(self) -> bool:
        """SIGTERM: finish the turn in progress, take no other."""

    @property
    def relocating(self) -> bool:
        """A copy restored from a checkpoint, not yet relocated: it writes nothing."""

    def apply(self, batch: Sequence[JournalEntry]) -> None:
        """Fold entries the gateway delivered into ``folder``."""

    async def backoff(self, failures: int, exc: BaseException) -> int:
        """Wait before the gateway is asked again; returns ``failures + 1``."""


class OwnerLoop:
    def __init__(self, host: OwnerHost) -> None:
        self.host = host
        self.superseded = False  # a later epoch took the session: take no more turns
        self.in_turn = False
        self._awaiting = 0  # seq of our last append: the next turn waits for it to come back
        self._released = 0  # the highest inbound seq the gateway released to us
        self._adopted = False  # the session's adoption (see _become_owner) is journaled
        self._channel: OwnerChannelClient | None = None
        self._hook: asyncio.Task[None] | None = None

    @property
    def session(self) -> str:
        return self.host.session

    @property
    def epoch(self) -> int:
        return self.host.epoch

    async def stop_hook(self) -> None:
        """Cancel the agent's ``on_owner`` background work, if it still runs."""
        if self._hook is not None and not self._hook.done():
            self._hook.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._hook
        self._hook = None

    async def run(self) -> None:
        """Take turns while there is released work; otherwise wait for deliveries.

        Deliveries and appends go over the owner channel (one WebSocket); entries are
        applied only between turns, so a turn's view of the state never changes.
        """
        failures = 0
        adopting = self._adopt_at_once()
        try:
            while not (self.superseded or self.host.stopping):
                try:
                    async with OwnerChannelClient(
                        self.host.client,
                        self.session,
                        epoch=self.epoch,
                        after=self.host.folder.watermark,
                    ) as channel:
                        self._channel = channel
                        failures = 0
                        if adopting is not None:
                            task, adopting = adopting, None
                            await task  # its turns ran while the channel opened
                            self.host.serving = True
                        await self._serve(channel)
                except ChannelClosed as exc:
                    if exc.superseded:
                        self.superseded = True
                    else:
                        failures = await self.host.backoff(failures, exc)
                except Superseded:
                    self.superseded = True
                except GatewayError as exc:
                    if exc.reason == "Fenced":
                        self.superseded = True
                    elif permanent(exc):
                        why = await self._refusal(exc)
                        raise WriteRefused(f"the gateway refused this owner: {why}") from exc
                    else:
                        failures = await self.host.backoff(failures, exc)
                except TRANSIENT as exc:
                    failures = await self.host.backoff(failures, exc)
                finally:
                    self._channel = None
        finally:
            if adopting is not None:
                adopting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await adopting

    async def _refusal(self, exc: GatewayError) -> GatewayError:
        """The gateway's own words for a refusal: a refused WebSocket handshake carries
        only a status, the same request over plain HTTP the JSON error."""
        if exc.reason != "HandshakeFailed":
            return exc
        try:
            await self.host.client.owner_entries(
                self.session, epoch=self.epoch, after=self.host.folder.watermark, limit=1
            )
        except GatewayError as explained:
            return explained
        except TRANSIENT:
            pass
        return exc

    def _adopt_at_once(self) -> asyncio.Task[None] | None:
        """A promoted shadow starts the turns a fence held back before its owner
        channel is open: it already has them (they precede the epoch marker in the tail
        it followed), and the gate released every inbound entry before the marker to
        the new epoch. Their append goes over plain HTTP if the channel is not up yet.
        Saves the channel's handshake and first delivery from the fence pause."""
        if self.host.promotion is None:
            return None
        self._released = max(self._released, self.host.promotion.fence_seq)
        return asyncio.create_task(self._become_owner(), name="adopt-session")

    async def _serve(self, channel: OwnerChannelClient) -> None:
        """Take turns while there is released work; otherwise wait for deliveries."""
        while not (self.superseded or self.host.stopping):
            self._take(channel)
            if not self._adopted:
                await self._become_owner()
                self.host.serving = True  # adopted, and the gateway took our channel
            elif (inbound := self._next_inbound(self.host.folder.peek())) is not None:
                await self._turns(
                    TurnGroup(self.host.folder.peek(), self.epoch, self._append), inbound
                )
            else:
                await channel.wait(OWNER_WAIT_S)

    def _take(self, channel: OwnerChannelClient) -> None:
        for delivery in channel.take():
            self.host.apply(delivery.entries)
            self._released = max(self._released, delivery.released)
        if self.host.folder.peek().epoch > self.epoch:
            self.superseded = True  # an epoch marker past ours: the session moved on

    def _next_inbound(self, state: SessionState) -> PendingInbound | None:
        """The next turn: the lowest pending inbound entry the gateway released to us,
        once the journal has caught up with our own last append."""
        if state.watermark < self._awaiting or not state.pending:
            return None
        inbound = next(iter(state.pending.values()))
        return inbound if inbound.seq <= self._released else None

    async def _become_owner(self) -> None:
        """Adopt the session: agent-state migration, uncertain calls, the on_owner hook.

        What adopting writes goes out with the first turns waiting (those a fence held
        back): one append, not two, before their clients hear back. The turns see the
        state as adopted.
        """
        self.host.processes.epoch = self.epoch  # whose background processes they will be
        state = self.host.folder.peek()
        entries = adoption_entries(self.host.agent, state, self.epoch)
        group = TurnGroup(state, self.epoch, self._append)
        if entries:
            state = group.hold(entries)
        journaled = self._awaiting
        if (inbound := self._next_inbound(state)) is not None:
            await self._turns(group, inbound)
        else:
            await group.flush()
        self._adopted = True
        # The gateway took what adopting wrote at our epoch: seen serving. (With nothing
        # to write, the owner channel opening at our epoch is what shows it.)
        self.host.serving = self._awaiting > journaled
        logger.info(
            "serving as owner",
            extra={
                "session": self.session,
                "epoch": self.epoch,
                "pending": len(self.host.folder.peek().pending),
                "since_marker_ms": None
                if self.host.promotion is None
                else round((time.time() - self.host.promotion.at) * 1000, 1),
            },
        )
        if self.host.agent.owner_hook is not None:
            # Background work the agent starts as owner must not hold up the turns the
            # session has been waiting for (a migration's buffered messages).
            self._hook = asyncio.create_task(self._owner_hook(), name="on-owner")

    async def _owner_hook(self) -> None:
        assert self.host.agent.owner_hook is not None
        context = OwnerContext(
            state=self.host.folder.view(),
            epoch=self.epoch,
            instance=self.host.identity.instance,
            append=self._append,
            processes=self.host.processes,
        )
        try:
            await self.host.agent.owner_hook(context)
            if outputs := context.take_outputs():
                await self._append(outputs)
        except Superseded:
            pass
        except Exception:
            logger.exception("the on_owner hook failed", extra={"session": self.session})

    async def _turns(self, group: TurnGroup, inbound: PendingInbound) -> None:
        """Take ``inbound``'s turn, and the turns queued behind it while they are quick;
        their outputs are journaled together (see ``shadowpod.agent.turn_group``)."""
        self.in_turn = True
        if (promoted := self.host.promotion) is not None and promoted.first_turn_at is None:
            promoted.first_turn, promoted.first_turn_at = inbound.seq, time.time()
        try:
            while True:
                outputs = await take_turn(
                    self.host.agent,
                    inbound,
                    group,
                    epoch=self.epoch,
                    instance=self.host.identity.instance,
                    processes=self.host.processes,
                )
                group.ended(outputs)
                self.host.turns += 1
                if not group.can_take_more():
                    break
                next_inbound = self._next_inbound(group.fold_ahead(outputs))
                if next_inbound is None:
                    break
                inbound = next_inbound
            await group.flush()
        finally:
            self.in_turn = False

    async def _append(self, entries: Sequence[NewEntry]) -> list[int]:
        """Journal at our epoch, in appends the gateway takes (see
        ``shadowpod.agent.appends``); returns the seqs of what was journaled. Our
        entries come back through the channel like everyone else's."""
        seqs: list[int] = []
        rest = list(entries)
        while rest:
            for batch in plan_appends(rest, self.host.limits):
                try:
                    seqs += await self._append_batch(batch.entries)
                except GatewayError as exc:
                    if exc.status != 413:
                        raise
                    if not self.host.limits.learn(exc):
                        raise WriteRefused(f"the gateway refused an append: {exc}") from exc
                    logger.warning(
                        "the gateway refused an append as too large (%s); cutting appends "
                        "to %d bytes and %d entries",
                        exc,
                        self.host.limits.max_bytes,
                        self.host.limits.max_entries,
                        extra={"session": self.session},
                    )
                    rest = rest[batch.first :]
                    break
            else:
                rest = []
        return seqs

    async def _append_batch(self, entries: Sequence[NewEntry]) -> list[int]:
        """One append; retried (same ids, so never doubled) while the gateway is away.
        ``WriteRefused`` when it can never succeed; a 413 goes to the caller."""
        deadline = time.monotonic() + APPEND_RETRY_S
        failures = 0
        while True:
            if self.host.relocating:  # a copy restored from a checkpoint: not the owner here
                raise Superseded("restored from a checkpoint elsewhere: this copy writes nothing")
            try:
                if self._channel is not None:
                    seqs = [seq for seq, _, _ in await self._channel.append(entries)]
                else:
                    appended, _, _ = await self.host.client.append(
                        self.session, epoch=self.epoch, entries=entries
                    )
                    seqs = [a.seq for a in appended]
            except GatewayError as exc:
                if exc.reason == "Fenced":
                    self.superseded = True
                    raise Superseded(str(exc)) from None
                if exc.status == 413:
                    raise
                if permanent(exc):
                    raise WriteRefused(f"the gateway refused an append for good: {exc}") from exc
                if time.monotonic() > deadline:
                    raise
                failures = await self.host.backoff(failures, exc)
            except ChannelClosed as exc:
                if exc.superseded:
                    self.superseded = True
                    raise Superseded(str(exc)) from None
                # Retried over HTTP (a frame over the gateway's limit closes the channel;
                # HTTP answers 413 naming the limit); the loop reconnects the channel.
                self._channel = None
                failures = await self.host.backoff(failures, exc)
            except TRANSIENT as exc:
                if time.monotonic() > deadline:
                    raise
                failures = await self.host.backoff(failures, exc)
            else:
                self._awaiting = max([self._awaiting, *seqs])
                return seqs


async def take_turn(
    agent: AgentDeclaration,
    inbound: PendingInbound,
    group: TurnGroup,
    *,
    epoch: int,
    instance: str,
    processes: ProcessRegistry,
) -> list[NewEntry]:
    """Run the handler for ``inbound`` on the group's state; returns its outputs, the
    ack last. A failing handler still ends its turn (with an error reply), or the
    message would come back forever."""
    state = group.state
    values = dict(state.agent.values)
    migrated = bool(values) and state.agent.schema_version != agent.state_schema
    if migrated:
        values = agent.migrate_state(values, state.agent.schema_version)
    turn = Turn(
        tools=agent.tools,
        state_schema=agent.state_schema,
        state=state,
        inbound=inbound,
        values=values,
        epoch=epoch,
        instance=instance,
        append=group.append,
        processes=processes,
        replaces_values=migrated,
        version=agent.version,
    )
    assert agent.message_handler is not None
    try:
        await agent.message_handler(turn)
    except Superseded:
        raise
    except ToolAbandoned as exc:
        await turn.reply(f"I could not confirm an earlier action: {exc}", error="tool_abandoned")
    except Exception as exc:  # the turn still ends, or it would come back forever
        logger.exception("turn %d failed", inbound.seq)
        await turn.reply(f"error while handling this message: {type(exc).__name__}", error=str(exc))
    outputs = turn.take_outputs()
    if (state_entry := turn.state_entry()) is not None:
        outputs.append(state_entry)
    outputs.append(NewEntry.of(AckPayload(turn=inbound.seq), id=f"ack:{inbound.seq}"))
    return outputs
