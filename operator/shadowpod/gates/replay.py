"""Replaying a golden file: the turns to answer again, each with the state its turn
started from, and what the candidate answered (the sandbox's report)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue

from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.state import PendingInbound, SessionState
from shadowpod.gates.answers import Answer, TurnPair
from shadowpod.gates.golden import GoldenFile


@dataclass(frozen=True)
class RecordedCall:
    """A tool call the source made, and what came back: the sandbox answers from it."""

    call_id: str
    tool: str
    args: dict[str, JsonValue]
    status: str | None = None  # None: no result was recorded
    result: JsonValue = None
    error: str | None = None


@dataclass
class GoldenTurn:
    inbound: PendingInbound
    expected: Answer
    calls: list[RecordedCall] = field(default_factory=list)

    @property
    def seq(self) -> int:
        return self.inbound.seq


def turn_of(entry: JournalEntry) -> int | None:
    turn = entry.payload.get("turn")
    return turn if isinstance(turn, int) and not isinstance(turn, bool) else None


def golden_turns(golden: GoldenFile) -> Iterator[tuple[GoldenTurn, SessionState]]:
    """Each turn of the slice whose inbound entry is in it, with the state the source
    had when the turn started (its first output or its ack): the state the candidate
    answers from. Recorded outputs are folded in between, so every turn starts from
    the source's state, not from the candidate's earlier answers."""
    outputs: dict[int, list[JournalEntry]] = {}
    for entry in golden.entries:
        turn = turn_of(entry)
        if turn is not None:
            outputs.setdefault(turn, []).append(entry)
    # Only whole turns: one still in progress when the slice was cut has no ack yet.
    whole = {e.payload.get("turn") for e in golden.entries if e.kind == "ack"}
    folder = StateFolder(golden.base)
    started: set[int] = set()
    for entry in golden.entries:
        turn = turn_of(entry)
        if turn is not None and turn not in started:
            started.add(turn)
            pending = folder.peek().pending.get(turn)
            if pending is not None and turn >= golden.header.from_seq and turn in whole:
                yield golden_turn(pending, outputs.get(turn, [])), folder.view()
        folder.apply(entry)


def golden_turn(inbound: PendingInbound, outputs: list[JournalEntry]) -> GoldenTurn:
    """A turn to answer again: ``inbound``, what the source answered (its ``outputs``,
    in journal order) and the tool calls it made, to answer the candidate's from."""
    expected = Answer.of_outputs((e.kind, e.payload) for e in outputs if e.kind != "ack")
    results = {e.payload.get("call_id"): e.payload for e in outputs if e.kind == "tool_result"}
    calls = []
    for e in outputs:
        if e.kind != "tool_call":
            continue
        call_id = str(e.payload.get("call_id"))
        result: dict[str, Any] = results.get(call_id) or {}
        calls.append(
            RecordedCall(
                call_id=call_id,
                tool=str(e.payload.get("tool")),
                args=dict(e.payload.get("args") or {}),
                status=result.get("status"),
                result=result.get("result"),
                error=result.get("error"),
            )
        )
    return GoldenTurn(inbound=inbound, expected=expected, calls=calls)


class SandboxOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str
    payload: dict[str, JsonValue]


class SandboxAnswer(BaseModel):
    """What the candidate did in one turn: its outputs, captured, never journaled, and
    the side effects the sandbox refused."""

    model_config = ConfigDict(extra="forbid")

    turn: int
    outputs: list[SandboxOutput]
    refused: list[str] = []

    @property
    def answer(self) -> Answer:
        return Answer.of_outputs((o.kind, o.payload) for o in self.outputs)


class SandboxReport(BaseModel):
    """A candidate's answers to a golden file, from the agent process that ran them."""

    model_config = ConfigDict(extra="forbid")

    agent: str
    version: str
    nondeterministic: list[str] = []
    answers: list[SandboxAnswer]


def pairs_of(golden: GoldenFile, report: SandboxReport) -> list[TurnPair]:
    """The golden turns matched with the candidate's answers; a turn it did not answer
    counts as an empty answer."""
    answers = {answer.turn: answer.answer for answer in report.answers}
    return [
        TurnPair(
            turn=turn.seq,
            inbound=turn.inbound.content,
            expected=turn.expected,
            got=answers.get(turn.seq, Answer()),
        )
        for turn, _ in golden_turns(golden)
    ]


def live_pairs(
    entries: Sequence[JournalEntry], report: SandboxReport, *, after: int, to: int
) -> list[TurnPair]:
    """Shadow compare's turns: those whose inbound came after ``after`` and whose ack
    is at or below ``to``, as the journal recorded them (``entries``, the journal after
    ``after``), each matched with the shadow's answer (an empty one if it gave none)."""
    inbound = {e.seq: e for e in entries if e.epoch == 0 and e.kind in ("message", "schedule")}
    outputs: dict[int, list[JournalEntry]] = {}
    acked: list[int] = []
    for entry in entries:
        turn = turn_of(entry)
        if turn is None or turn not in inbound:
            continue
        if entry.kind != "ack":
            outputs.setdefault(turn, []).append(entry)
        elif entry.seq <= to:
            acked.append(turn)
    answers = {answer.turn: answer.answer for answer in report.answers}
    return [
        TurnPair(
            turn=turn,
            inbound=str(inbound[turn].payload.get("content", "")),
            expected=Answer.of_outputs((e.kind, e.payload) for e in outputs.get(turn, [])),
            got=answers.get(turn, Answer()),
        )
        for turn in sorted(acked)
    ]
