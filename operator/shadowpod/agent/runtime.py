"""The agent runtime: owner mode, shadow mode, promotion, draining.

State is always the fold of the journal, in seq order, applied as the journal comes
in (a shadow tails the whole journal; an owner reads the gated owner stream). The
owner's turn-taking is ``shadowpod.agent.owner``; restoring and catching up,
``shadowpod.agent.restore``.

A shadow restores a snapshot, catches up, and keeps applying entries — recorded
outputs are applied, never re-executed. When it applies an ``epoch`` marker naming
it, it is the owner: it migrates the agent's state to its schema, decides about
uncertain tool calls, and starts taking turns at the new epoch. An owner whose epoch
is superseded stops taking work, drains its background processes, reports, and
exits 0.

A checkpoint (``checkpoint``) is a forked, stopped copy of this process that CRIU
dumps (``shadowpod.agent.checkpoint``); the watermark it answers with is the state
the copy holds. A copy restored somewhere else continues inside ``checkpoint``: it
relocates (``_relocate``) — forgets the connections and background processes that
were the source's, re-reads who and where it is now, serves its endpoints at its new
address — and goes on as a shadow from the state it kept in memory, catching up from
its own watermark, until the ExchangeFence names it owner. It cannot repeat anything
the source did: the checkpoint is taken between turns, and until it is promoted it
writes nothing (its appends are refused at once, ``_relocating``).

An owner whose write the gateway refuses for good (``WriteRefused``) stops taking
turns and stays up, failed: not ready, not healthy, the error in its status — a
process that exited would take its reason with it, and a session that silently stops
answering is the one outcome nobody can act on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal, TypeVar

from shadowpod.agent.appends import AppendLimits, WriteRefused, permanent
from shadowpod.agent.checkpoint import CheckpointUnsupported, fork_for_checkpoint
from shadowpod.agent.compare import CompareWindow, WindowLost
from shadowpod.agent.declaration import AgentDeclaration
from shadowpod.agent.identity import Identity
from shadowpod.agent.owner import TRANSIENT, OwnerLoop
from shadowpod.agent.processes import ProcessRegistry
from shadowpod.agent.promotion import CatchUp, Promotion
from shadowpod.agent.restore import catch_up, restore
from shadowpod.agent.settings import AgentSettings
from shadowpod.agent.snapshots import Snapshotter
from shadowpod.api.models import DrainReport, ProcessReport
from shadowpod.client.gateway import GatewayClient, GatewayError
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import (
    ControlEvent,
    EntryKind,
)
from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.state import SessionState

logger = logging.getLogger(__name__)
T = TypeVar("T")
BACKOFF_S: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)

CHECKPOINT_POLL_S: Final = 0.005

Mode = Literal["starting", "shadow", "owner", "draining", "stopped", "failed"]
Rebind = Callable[[str, int], Awaitable[None]]


@dataclass(frozen=True)
class CheckpointTaken:
    """A stopped copy of this process (``pid``), holding the state at ``watermark``."""

    pid: int
    watermark: int
    epoch: int
    instance: str
    mode: str


class CheckpointRefused(Exception):
    """No checkpoint now: the reason says why (busy in a turn, the wrong mode)."""


class AgentRuntime:
    """An agent process: restores, shadows, owns (an ``OwnerLoop`` per owner phase, which
    this class hosts: it is the loop's ``OwnerHost``), drains."""

    def __init__(self, agent: AgentDeclaration, settings: AgentSettings) -> None:
        if agent.message_handler is None:
            raise ValueError(f"agent {agent.name!r} has no @on_message handler")
        self.agent = agent
        self.settings = settings
        self.mode: Mode = "starting"
        self.ready = False
        # Owner at ``epoch``, adopted, and the gateway took its writes: what a migration
        # waits for before it calls itself done.
        self.serving = False
        self.epoch = 0
        self.identity = Identity.load(settings.identity_dir)
        self.folder = StateFolder(SessionState())
        self.processes = ProcessRegistry(settings.process_inventory)
        self.limits = AppendLimits(settings.max_append_bytes, settings.max_append_entries)
        self.turns = 0
        self.warmed = 0  # the watermark the on_shadow_ready hook last saw (0: never)
        self.catchup: CatchUp | None = None
        self.promotion: Promotion | None = None
        self.drained: list[ProcessReport] | None = None
        self.error: str | None = None
        self._client: GatewayClient | None = None
        self.stopping = False
        # A copy restored from a checkpoint, not yet relocated: writes nothing.
        self.relocating = False
        # The owner phase (see ``_owner_phase``); the last one stays, its hook stopped.
        self.owner: OwnerLoop | None = None
        self._owning: asyncio.Task[None] | None = None
        self._reapers: set[asyncio.Task[tuple[int, int]]] = set()
        # Serves the status endpoints at a new address (set by whoever serves them).
        self.rebind: Rebind | None = None
        self.snapshots = Snapshotter(
            self.identity.session, settings.snapshot_every, self._store_snapshot
        )
        # Shadow compare in place (``shadowpod.agent.compare``): open while a gate asks.
        self.window: CompareWindow | None = None
        self._closing: set[asyncio.Task[None]] = set()

    # --- lifecycle --------------------------------------------------------------------

    @property
    def session(self) -> str:
        return self.identity.session

    @property
    def client(self) -> GatewayClient:
        if self._client is None:
            self._client = GatewayClient(
                self.identity.gateway, self.identity.token, owner=self.identity.owner
            )
        return self._client

    @property
    def in_turn(self) -> bool:
        return self.owner is not None and self.owner.in_turn

    async def reconnect(self) -> None:
        """Forget the connection and re-read who we are (a restored process must)."""
        if self._client is not None:
            await self._client.close()
            self._client = None
        self.identity = Identity.load(self.settings.identity_dir)

    async def run(self) -> int:
        try:
            await self._restore()
            if self.settings.mode == "shadow":
                self.mode = "shadow"
                self.ready = True
                await self._catch_up()
                await self._shadow()
            else:
                assert self.settings.epoch is not None
                self.epoch = self.settings.epoch
                # Adopting the session (uncertain tool calls, the agent-state migration,
                # the on_owner hook) needs the state at the head, not at the snapshot.
                await self._catch_up()
            while not self.stopping:
                self.mode = "owner"
                self.ready = True
                if not await self._owner_phase():
                    break
                await self._relocate()
            await self._drain()
            return 0
        except asyncio.CancelledError:
            await self._drain()
            return 0
        except WriteRefused as exc:
            return await self._refused(exc)
        except Exception as exc:
            logger.exception("agent runtime failed", extra={"session": self.session})
            self.mode, self.error = "failed", f"{type(exc).__name__}: {exc}"
            await self.processes.drain(self.settings.drain_grace_s)
            return 1
        finally:
            if self._client is not None:
                await self._client.close()

    def request_stop(self, main: asyncio.Task[int]) -> None:
        """SIGTERM: finish the turn in progress, then drain and exit."""
        self.stopping = True
        if not self.in_turn:
            main.cancel()

    async def _owner_phase(self) -> bool:
        """Own the session until superseded or stopped: ``False``; or until this process
        finds itself restored from a checkpoint somewhere else: ``True``."""
        self.owner = OwnerLoop(self)
        self._owning = asyncio.create_task(self.owner.run(), name="owner")
        try:
            await self._owning
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.relocating or (task is not None and task.cancelling()):
                raise
        finally:
            self._owning = None
        return self.relocating

    # --- checkpoints ------------------------------------------------------------------

    async def checkpoint(self, output: Path | None, wait_s: float) -> CheckpointTaken:
        """Fork a stopped copy of this process for CRIU to dump, between turns.

        Waits up to ``wait_s`` for the turn in progress to end; no turn starts between
        that and the fork (no ``await`` between them). In a copy restored from the
        checkpoint this returns too — after relocating, as a shadow (``pid`` 0).
        """
        if self.mode != "owner" or self._owning is None:
            raise CheckpointRefused(
                f"this instance is {self.mode}: only a serving owner is checkpointed"
            )
        deadline = time.monotonic() + wait_s
        while self.in_turn:
            if time.monotonic() > deadline:
                raise CheckpointRefused(f"a turn was still running after {wait_s:g}s")
            await asyncio.sleep(CHECKPOINT_POLL_S)
        taken = CheckpointTaken(
            pid=0,
            watermark=self.folder.watermark,
            epoch=self.epoch,
            instance=self.identity.instance,
            mode=self.mode,
        )
        try:
            pid = fork_for_checkpoint(asyncio.get_running_loop(), output)
        except CheckpointUnsupported as exc:
            raise CheckpointRefused(str(exc)) from None
        if pid == 0:
            self._restored()
            return taken
        reaper = asyncio.create_task(asyncio.to_thread(os.waitpid, pid, 0), name=f"reap-{pid}")
        self._reapers.add(reaper)  # the copy ends when CRIU has dumped it
        reaper.add_done_callback(self._reapers.discard)
        logger.info(
            "checkpoint forked",
            extra={"session": self.session, "pid": pid, "watermark": taken.watermark},
        )
        return CheckpointTaken(pid, taken.watermark, taken.epoch, taken.instance, taken.mode)

    def _restored(self) -> None:
        """The first thing a restored copy does, before any other task runs: stop
        acting as what it was. Its writes are refused from here on; its owner loop is
        cancelled (the run loop then relocates it, see ``_owner_phase``)."""
        self.relocating = True
        self.ready = self.serving = False
        if self._owning is not None:
            self._owning.cancel()

    async def _relocate(self) -> None:
        """A restored copy, in its new place: a shadow of the session, with every
        object it held in memory, at the watermark it was checkpointed at."""
        self.mode = "starting"
        if self.owner is not None:
            await self.owner.stop_hook()
            self.owner = None
        await self.snapshots.cancel()
        # Its environment is the source's; the place says what differs here.
        os.environ.update(Identity.environment(self.settings.identity_dir))
        self.settings = AgentSettings.from_env()
        # The background processes were the source's (a fork has no children): gone
        # from this process's view without a signal, as the new owner starts its own.
        self.processes = ProcessRegistry(self.settings.process_inventory)
        await self.reconnect()
        if self.rebind is not None:
            await self.rebind(self.settings.host, self.settings.port)
        self.promotion = self.catchup = None
        self.relocating = False
        self.mode = "shadow"
        self.ready = True
        logger.info(
            "restored from a checkpoint",
            extra={
                "session": self.session,
                "instance": self.identity.instance,
                "watermark": self.folder.watermark,
            },
        )
        await self._catch_up()
        await self._shadow()

    # --- restoring and catching up ----------------------------------------------------

    async def _restore(self) -> None:
        state = await self._retried(
            lambda: restore(self.client, self.session, self.agent, self.settings.snapshot)
        )
        self.folder = StateFolder(state)
        logger.info("restored", extra={"session": self.session, "watermark": state.watermark})

    async def _catch_up(self) -> None:
        # Asked again from where the last attempt got to: what it applied stays applied.
        self.catchup = await self._retried(
            lambda: catch_up(self.client, self.session, self.folder.watermark, self.apply)
        )

    async def _retried(self, step: Callable[[], Awaitable[T]]) -> T:
        """``step()``, asked again while the gateway cannot be reached or answers that
        it cannot serve now (a gateway restarting as an instance starts): an instance
        that gave up then would fail a migration the gateway's return lets finish."""
        failures = 0
        while True:
            try:
                return await step()
            except (GatewayError, *TRANSIENT) as exc:
                failures = await self._unless_permanent(failures, exc)

    async def _unless_permanent(self, failures: int, exc: Exception) -> int:
        """Back off before the gateway is asked again (see ``_backoff``); an answer that
        can never change (``permanent``) is raised instead."""
        if isinstance(exc, GatewayError) and permanent(exc):
            raise exc
        return await self.backoff(failures, exc)

    # --- shadow -----------------------------------------------------------------------

    async def _shadow(self) -> None:
        failures = 0
        # No await since the catch-up was recorded: the engine sees this shadow caught
        # up only once warm, so a fence never waits for the first, longest, warm-up.
        self._warm()
        while self.promotion is None and not self.stopping:
            try:
                async for batch in self.client.journal_stream(
                    self.session, after=self.folder.watermark
                ):
                    self.apply(batch)
                    failures = 0
                    if self.promotion is not None:
                        break
                    self._warm()
            except (GatewayError, *TRANSIENT) as exc:
                failures = await self._unless_permanent(failures, exc)
        await self.close_window()
        if self.promotion is not None:
            self.epoch = self.promotion.epoch
            logger.info(
                "promoted",
                extra={
                    "session": self.session,
                    "epoch": self.epoch,
                    "fence_seq": self.promotion.fence_seq,
                    "since_marker_ms": round((time.time() - self.promotion.at) * 1000, 1),
                },
            )

    # --- shadow compare ---------------------------------------------------------------

    def open_window(self, after: int, turns: int | None = None) -> CompareWindow:
        """Answer every live turn after ``after`` in the sandbox as it is followed (see
        ``shadowpod.agent.compare``). Asked again with the same ``after``, the open
        window is kept; a shadow that already folded past ``after`` opens it at its
        watermark (the window's ``after`` says where). ``turns``: answer that many
        turns of the window, no more."""
        if self.mode != "shadow" or self.promotion is not None:
            raise WindowLost(f"this instance is {self.mode}: only a shadow compares")
        if self.window is not None and self.window.after == after:
            return self.window
        if self.window is not None:
            closing = asyncio.get_running_loop().create_task(self.window.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        self.window = CompareWindow(self.agent, max(after, self.folder.watermark), turns)
        return self.window

    async def close_window(self) -> None:
        if self.window is not None:
            window, self.window = self.window, None
            await window.close()

    def _warm(self) -> None:
        """The agent's ``on_shadow_ready`` hook on the state caught up to (not on the
        batch that promotes: that is the fence pause; the first turn does the rest)."""
        hook = self.agent.shadow_ready_hook
        if hook is None or self.folder.watermark == self.warmed:
            return
        state = self.folder.peek()
        values = state.agent.values
        try:
            if values and state.agent.schema_version != self.agent.state_schema:
                values = self.agent.migrate_state(dict(values), state.agent.schema_version)
            hook(MappingProxyType(values))
        except Exception:
            logger.exception("the on_shadow_ready hook failed", extra={"session": self.session})
        self.warmed = self.folder.watermark

    # --- applying the journal ---------------------------------------------------------

    def apply(self, batch: Sequence[JournalEntry]) -> None:
        """Fold ``batch``; a control entry is acted on with the state right after it.

        Runs of other entries are folded in one call: entry by entry, the folder's
        per-call cost was an eighth of a catch-up's time.
        """
        if self.window is not None and self.mode == "shadow" and self.window.following:
            self._apply_in_window(batch, self.window)
        else:
            self._apply_plain(batch)

    def _apply_in_window(self, batch: Sequence[JournalEntry], window: CompareWindow) -> None:
        """``_apply`` while a compare window is open: the fold stops before each
        window turn's first output, so the sandbox gets the state the turn started
        from. A slice with no such turn is folded as ``_apply`` folds it."""
        start = 0
        for index, entry in enumerate(batch):
            if window.starts_turn(entry):
                self._apply_plain(batch[start:index])
                window.turn_started(entry, self.folder.peek())
                start = index
        self._apply_plain(batch[start:])
        window.saw(batch)

    def _apply_plain(self, batch: Sequence[JournalEntry]) -> None:
        requested = False
        folded = 0
        for index, entry in enumerate(batch):
            if entry.kind != EntryKind.CONTROL:
                continue
            self.folder.apply_all(batch[folded : index + 1])
            folded = index + 1
            event = entry.payload.get("event")
            if event == ControlEvent.EPOCH:
                self._on_epoch(entry)
            elif event == ControlEvent.SNAPSHOT_REQUEST:
                requested = True
        self.folder.apply_all(batch[folded:])
        self.snapshots.applied(
            self.folder, len(batch), owner=self.mode == "owner", requested=requested
        )

    def _on_epoch(self, entry: JournalEntry) -> None:
        state = self.folder.peek()
        if (
            self.mode == "shadow"
            and state.owner == self.identity.instance
            and self.promotion is None
        ):
            # The state at fence_seq, fingerprinted: it must equal what the source had.
            self.promotion = Promotion(state.epoch, entry.seq, state.working_copy(), time.time())

    # --- snapshots --------------------------------------------------------------------

    async def snapshot(self) -> int:
        """Store a snapshot of the current state while serving; returns its watermark."""
        return await self.snapshots.take(self.folder)

    async def _store_snapshot(self, view: SessionState, document: bytes) -> None:
        await self.client.put_snapshot(
            self.session,
            epoch=self.epoch,
            watermark=view.watermark,
            schema_version=view.schema_version,
            document_json=document,
        )

    # --- leaving ----------------------------------------------------------------------

    async def _drain(self) -> None:
        if self.mode in ("draining", "stopped"):
            return
        was_owner = self.mode == "owner"
        self.mode = "draining"
        self.serving = False
        drained = await self._stop_background(report=was_owner)
        self.mode = "stopped"
        logger.info(
            "stopped",
            extra={
                "session": self.session,
                "epoch": self.epoch,
                "processes": [p.name for p in drained],
            },
        )

    async def _refused(self, exc: WriteRefused) -> int:
        """Fail for good, visibly (see the module's docstring); exit 1 on SIGTERM."""
        logger.error(
            "the owner cannot go on: %s", exc, extra={"session": self.session, "epoch": self.epoch}
        )
        self.mode, self.ready, self.serving, self.error = "failed", False, False, str(exc)
        await self._stop_background(report=True)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()  # until SIGTERM (see ``request_stop``)
        return 1

    async def _stop_background(self, *, report: bool) -> list[ProcessReport]:
        """Stop what runs besides turns; drain the background processes and, as an
        owner, journal what became of them."""
        if self.owner is not None:
            await self.owner.stop_hook()
        await self.snapshots.cancel()
        drained = self.drained = await self.processes.drain(self.settings.drain_grace_s)
        if report:
            try:
                await self.client.drained(
                    self.session,
                    DrainReport(
                        instance=self.identity.instance, epoch=self.epoch, processes=drained
                    ),
                )
            except (*TRANSIENT, GatewayError) as exc:
                logger.warning(
                    "could not report the drain: %s", exc, extra={"session": self.session}
                )
        return drained

    async def backoff(self, failures: int, exc: BaseException) -> int:
        delay = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
        logger.warning(
            "gateway unreachable (%s); retrying in %.2fs",
            exc,
            delay,
            extra={"session": self.session},
        )
        await asyncio.sleep(delay)
        await self.reconnect()
        return failures + 1
