"""In-place shadow compare: the shadow answers live turns in its sandbox as it follows.

Once a window is opened (``POST /v1/compare/window``), every live turn whose inbound
seq is above the window's ``after`` is answered by this process — the shadow, the new
version, with the objects it holds in memory — from the state it had folded when the
source's first output of that turn came in, before folding it. The answer runs once
the turn's ack has come (its recorded tool results are what the sandbox answers tool
calls from), in one task, one turn after another, so folding never waits for it.
The answers are kept for ``GET /v1/compare``; the source's outputs are folded as
always. Outside a window the shadow folds as it always did: nothing here runs.

A window lives in this process only: a shadow restarted mid-window has none, and says
so (``WindowLost``); the engine then opens another one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from shadowpod.agent.declaration import AgentDeclaration
from shadowpod.agent.sandbox import answer_in_sandbox
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.state import PendingInbound, SessionState
from shadowpod.gates.replay import SandboxAnswer, SandboxReport, golden_turn, turn_of

logger = logging.getLogger(__name__)


class WindowNotReady(Exception):
    """The shadow has not followed (and answered) up to the seq asked for yet."""


class WindowLost(Exception):
    """No window from that seq in this process (restarted, or another one opened)."""


@dataclass
class _Started:
    inbound: PendingInbound
    state: SessionState
    outputs: list[JournalEntry] = field(default_factory=list)


class CompareWindow:
    def __init__(self, agent: AgentDeclaration, after: int, turns: int | None = None) -> None:
        self.agent = agent
        self.after = after
        self.turns = turns  # answer this many turns, then fold as if there were no window
        self.opened_at = time.time()
        self.answers: dict[int, SandboxAnswer] = {}
        self._acks: dict[int, int] = {}  # turn -> the seq of its ack
        self._seen: set[int] = set()  # turns whose first output came in the window
        self._started: dict[int, _Started] = {}  # until their ack
        self._queue: asyncio.Queue[tuple[int, _Started]] = asyncio.Queue()
        self._unanswered: set[int] = set()  # ack seqs whose turn is not answered yet
        self._worker: asyncio.Task[None] | None = None

    # --- as the shadow folds (no await: the fold never waits) --------------------------

    @property
    def following(self) -> bool:
        """Turns to capture or to see end: ``False`` once the window's turns are all in
        (the shadow then folds as it does without a window)."""
        return self.turns is None or len(self._seen) < self.turns or bool(self._started)

    def starts_turn(self, entry: JournalEntry) -> bool:
        """``entry`` is the first output of a window's turn: capture the state first."""
        turn = turn_of(entry)
        return (
            turn is not None
            and turn > self.after
            and turn not in self._seen
            and (self.turns is None or len(self._seen) < self.turns)
        )

    def turn_started(self, entry: JournalEntry, state: SessionState) -> None:
        """The state folded so far (``state``, not yet holding ``entry``) is the one
        the turn is answered from."""
        turn = turn_of(entry)
        assert turn is not None
        self._seen.add(turn)
        inbound = state.pending.get(turn)
        if inbound is None:  # not an inbound turn this shadow saw arrive
            return
        self._started[turn] = _Started(inbound, state.working_copy())

    def saw(self, entries: Iterable[JournalEntry]) -> None:
        """Outputs of the window's turns, kept until each turn's ack; an ack queues its
        turn for the sandbox."""
        for entry in entries:
            turn = turn_of(entry)
            started = None if turn is None else self._started.get(turn)
            if started is None or turn is None:
                continue
            if entry.kind == "ack":
                del self._started[turn]
                self._acks[turn] = entry.seq
                self._unanswered.add(entry.seq)
                self._queue.put_nowait((entry.seq, started))
                self._ensure_worker()
            else:
                started.outputs.append(entry)

    # --- the sandbox, one turn after another ------------------------------------------

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._answer(), name="compare-window")

    async def _answer(self) -> None:
        while not self._queue.empty():
            ack_seq, started = self._queue.get_nowait()
            turn = golden_turn(started.inbound, started.outputs)
            try:
                answer = await answer_in_sandbox(self.agent, turn, started.state)
            except Exception as exc:  # the handler's own failures end as a reply already
                logger.exception("the sandbox failed on turn %d", turn.seq)
                answer = SandboxAnswer(
                    turn=turn.seq, outputs=[], refused=[f"the sandbox failed: {exc!r}"]
                )
            self.answers[turn.seq] = answer
            self._unanswered.discard(ack_seq)

    async def close(self) -> None:
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    # --- what the engine reads --------------------------------------------------------

    def report(self, *, after: int, to: int, watermark: int) -> SandboxReport:
        """The answers to the turns after ``after`` acked at or below ``to``."""
        if after != self.after:
            raise WindowLost(
                f"this shadow's compare window starts after seq {self.after}, not {after}"
            )
        if watermark < to or any(seq <= to for seq in self._unanswered):
            raise WindowNotReady(f"the shadow has followed to seq {watermark}, not yet {to}")
        turns = sorted(turn for turn, ack in self._acks.items() if ack <= to)
        return SandboxReport(
            agent=self.agent.name,
            version=self.agent.version,
            nondeterministic=list(self.agent.nondeterministic_patterns),
            answers=[self.answers[turn] for turn in turns if turn in self.answers],
        )
