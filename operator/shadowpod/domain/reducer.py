"""The reducer: ``state = fold(snapshot, entries after it)`` (DESIGN.md §3 rule 5).

``apply`` is pure and total: it never mutates its input and never raises on a
well-formed ``JournalEntry``. Kinds it does not know, and payloads it cannot parse
(written by a newer version), are kept in ``extensions`` rather than dropped.

Processing order (rule 6): an inbound entry enters the transcript when its turn
starts — the first owner output that names it in ``turn``, or its ack — not when it
arrived. That way the transcript is what the owner actually saw, even when messages
arrive mid-turn. It stays in ``pending`` until its ack: a turn that started but was
never acked is still work for the next owner.

A ``state`` entry too large for one append is journaled in parts (``StatePart``);
they wait in ``state.agent.parts`` and the whole entry is applied when the last one
arrives — nothing of it before, so no one ever sees half of it. Parts of a turn that
ended without them (its owner died mid-way and the redone turn wrote other values)
are dropped with that turn's ack; parts outside any turn (adopting the session) with
the next epoch, whose owner adopts the session anew.

A ``state`` entry's ``ops`` are deltas (``shadowpod.domain.deltas``), applied after
its ``values``; an op that does not fit is skipped and the entry kept in
``extensions`` with what was wrong, so the fold stays total and the same everywhere.

``fold`` and ``StateFolder`` copy the state's containers once and then apply entries
in place, so replaying *n* entries costs O(n), not O(n²) — deltas included: a
container of the agent's values is copied once per batch, not once per op.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Final

from pydantic import ValidationError

from shadowpod.domain.deltas import Owned, apply_ops
from shadowpod.domain.entries import JournalEntry, is_inbound
from shadowpod.domain.payloads import (
    MAX_SCHEDULES_PER_SESSION,
    AckPayload,
    ControlEvent,
    ControlPayload,
    CredentialOp,
    CredentialPayload,
    EntryKind,
    FactOp,
    FactPayload,
    MemoryOp,
    MemoryPayload,
    MessagePayload,
    Payload,
    ProcessOp,
    ProcessPayload,
    Role,
    ScheduleOp,
    SchedulePayload,
    StatePayload,
    ToolCallPayload,
    ToolResultPayload,
    read_back_model,
)
from shadowpod.domain.state import (
    CallStatus,
    CredentialBinding,
    ExtensionEntry,
    Fact,
    PendingInbound,
    ProcessRecord,
    ProcessStatus,
    Schedule,
    SessionState,
    StateParts,
    ToolCall,
    TranscriptMessage,
)


def apply(state: SessionState, entry: JournalEntry) -> SessionState:
    """The state after ``entry``. ``state`` is left untouched."""
    return fold(state, (entry,))


def fold(state: SessionState, entries: Iterable[JournalEntry]) -> SessionState:
    """The state after all ``entries``. ``state`` is left untouched."""
    folder = StateFolder(state)
    folder.apply_all(entries)
    return folder.release()


class StateFolder:
    """Applies entries in place to a private working copy of a state.

    Used where entries keep coming (a shadow tailing the journal). Entries at or
    below the watermark are already reflected and are skipped, so overlapping reads
    are harmless.
    """

    def __init__(self, state: SessionState) -> None:
        self._state = state.working_copy()

    @property
    def watermark(self) -> int:
        return self._state.watermark

    def view(self) -> SessionState:
        """The current state, as a copy the caller may keep."""
        return self._state.working_copy()

    def peek(self) -> SessionState:
        """The current state itself, without a copy: read it, never change or keep it."""
        return self._state

    def release(self) -> SessionState:
        """The current state itself; the folder must not be used afterwards."""
        state, self._state = self._state, SessionState()
        return state

    def apply_all(self, entries: Iterable[JournalEntry]) -> None:
        # The watermark is kept in a local and stored once per batch: assigning a field
        # of a pydantic model costs more than folding a small entry does.
        state = self._state
        watermark = state.watermark
        # Containers of the agent's values this batch copied: they are changed in place
        # by later deltas of the batch. Not kept past it: a view taken between two
        # batches shares them.
        owned: Owned = {}
        try:
            for entry in entries:
                if entry.seq > watermark:
                    _fold_one(state, entry, owned)
                    watermark = entry.seq
        finally:
            state.watermark = watermark

    def apply(self, entry: JournalEntry) -> None:
        self.apply_all((entry,))


def _fold_one(state: SessionState, entry: JournalEntry, owned: Owned) -> None:
    handler = _HANDLERS.get(entry.kind)
    if handler is None:
        _keep_as_extension(state, entry, error=None)
        return
    try:
        payload = handler.validate(entry.payload)
    except ValidationError as exc:
        _keep_as_extension(state, entry, error=_short(exc))
    else:
        if handler.model is StatePayload:
            _state(state, entry, payload, owned)
        else:
            handler.fn(state, entry, payload)


# --- handlers ---------------------------------------------------------------------------


class _Handler:
    __slots__ = ("fn", "model", "validate")

    def __init__(
        self,
        model: type[Payload],
        fn: Callable[[SessionState, JournalEntry, Payload], None],
    ) -> None:
        self.model = model
        self.fn = fn
        # The validator itself (``model_validate`` adds a Python call per entry), of the
        # model as read back from the journal (JSON values not walked again).
        self.validate: Callable[[object], Payload] = read_back_model(
            model
        ).__pydantic_validator__.validate_python


def _start_turn(state: SessionState, turn: int | None) -> None:
    if turn is None:
        return
    inbound = state.pending.get(turn)
    if inbound is not None and not inbound.started:
        # Every turn passes here: spelled out, as ``dataclasses.replace`` inspects the
        # fields on each call and took a fifth of a shadow's catch-up.
        state.pending[turn] = PendingInbound(
            seq=inbound.seq,
            id=inbound.id,
            kind=inbound.kind,
            role=inbound.role,
            content=inbound.content,
            schedule_id=inbound.schedule_id,
            meta=inbound.meta,
            started=True,
        )
        state.transcript.append(
            TranscriptMessage(
                seq=inbound.seq,
                role=inbound.role,
                content=inbound.content,
                turn=turn,
                epoch=0,
                meta=inbound.meta,
            )
        )


def _message(state: SessionState, entry: JournalEntry, payload: Payload) -> None:
    assert isinstance(payload, MessagePayload)
    if is_inbound(entry):
        state.pending[entry.seq] = PendingInbound(
            seq=entry.seq,
            id=entry.id,
            kind=entry.kind,
            role=payload.role,
            content=payload.content,
            meta=payload.meta,
        )
        return
    _start_turn(state, payload.turn)
    state.transcript.append(
        TranscriptMessage(
            seq=entry.seq,
            role=payload.role,
            content=payload.content,
            turn=payload.turn,
            epoch=entry.epoch,
            meta=payload.meta,
        )
    )


def _tool_call(state: SessionState, entry: JournalEntry, payload: Payload) -> None:
    assert isinstance(payload, ToolCallPayload)
    _start_turn(state, payload.turn)
    state.tools.declared[payload.tool] = payload.idempotent
    state.tools.calls[payload.call_id] = ToolCall(
        call_id=payload.call_id,
        tool=payload.tool,
        args=payload.args,
        idempotent=payload.idempotent,
        turn=payload.turn,
        intent_seq=entry.seq,
    )


def _tool_result(state: SessionState, entry: JournalEntry, payload: Payload) -> None:
    assert isinstance(payload, ToolResultPayload)
    _start_turn(state, payload.turn)
    # A result without a journaled intent is kept visible (tool "") rather than lost.
    known = state.tools.calls.get(payload.call_id) or ToolCall(
        call_id=payload.call_id, tool="", turn=payload.turn
    )
    state.tools.calls[payload.call_id] = replace(
        known,
        status=CallStatus(payload.status.value),
        result=payload.result,
        error=payload.error,
        result_seq=entry.seq,
    )


def _memory(state: SessionState, entry: JournalEntry, payload: Payload) -> None:
    assert isinstance(payload, MemoryPayload)
    _start_turn(state, payload.turn)
    if payload.op is MemoryOp.DELETE:
        state.memory.pop(payload.key, None)
    else:
        state.memory[payload.key] = payload.value


def _fact(state: SessionState, entry: JournalEntry, payload: Payload) -> None:
    assert isinstance(payload, FactPayload)
    _start_turn(state, payload.turn)
    if payload.op is FactOp.RETRACT:
        state.facts.pop(payload.fact_id, None)
    else:
        state.facts[payload.fact_id] = Fact(
            fact_id=payload.fact_id, text=payload.text, seq=entry.seq
        )


def _schedule(state: SessionState, entry: JournalEntry, payload: Payload) -> None:
    assert isinstance(payload, SchedulePayload)
    if payload.op is ScheduleOp.FIRE:
        if is_inbound(entry):
            state.pending[entry.seq] = PendingInbound(
                seq=entry.seq,
                id=entry.id,
                kind=entry.kind,
                role=Role.SYSTEM,
                content=payload.content,
                schedule_id=payload.schedule_id,
            )
        known = state.schedules.get(payload.schedule_id)
        if known is not None and payload.fire_no is not None and payload.fire_no > known.fired:
            state.schedules[payload.schedule_id] = replace(
                known, fired=payload.fire_no, last_fire_seq=entry.seq
            )
        return
    _start_turn(state, payload.turn)
    if payload.op is ScheduleOp.CANCEL:
        state.schedules.pop(payload.schedule_id, None)
    elif payload.every_s is not None:
        if (
            payload.schedule_id not in state.schedules
            and len(state.schedules) >= MAX_SCHEDULES_PER_SESSION
        ):
            # The gateway fires what the state holds: a session's schedules are bounded.
            _keep_as_extension(
                state,
                entry,
                error=f"the session already has {MAX_SCHEDULES_PER_SESSION} schedules, the "
                "most it may have; cancel one first",
            )
            return
        state.schedules[payload.schedule_id] = Schedule(
            schedule_id=payload.schedule_id,
            every_s=payload.every_s,
            content=payload.content,
            anchor=entry.ts,
            set_seq=entry.seq,
            wake=payload.wake,
        )


def _process(state: SessionState, entry: JournalEntry, payload: Payload) -> None:
    assert isinstance(payload, ProcessPayload)
    _start_turn(state, payload.turn)
    if payload.op is ProcessOp.STARTED:
        state.processes[payload.name] = ProcessRecord(
            name=payload.name, command=payload.command, pid=payload.pid, started_seq=entry.seq
        )
        return
    known = state.processes.get(payload.name) or ProcessRecord(name=payload.name)
    if known.pid is not None and payload.pid is not None and payload.pid != known.pid:
        # The end of another process of that name (a previous owner's, reported as it
        # drained): the one on record, started since, is not affected.
        return
    state.processes[payload.name] = replace(
        known,
        status=ProcessStatus(payload.op.value),
        exit_code=payload.exit_code,
        ended_seq=entry.seq,
    )


def _credential(state: SessionState, entry: JournalEntry, payload: Payload) -> None:
    assert isinstance(payload, CredentialPayload)
    if payload.op is CredentialOp.UNBIND:
        state.credentials.pop(payload.name, None)
    else:
        state.credentials[payload.name] = CredentialBinding(
            name=payload.name, secret_ref=payload.secret_ref
        )


def _state(state: SessionState, entry: JournalEntry, payload: Payload, owned: Owned) -> None:
    assert isinstance(payload, StatePayload)
    _start_turn(state, payload.turn)
    if payload.part is not None:
        whole = _state_part(state, entry, payload)
        if whole is None:
            return
        payload = whole
    if payload.replace:
        state.agent.values = dict(payload.values)
    else:
        state.agent.values.update(payload.values)
    if payload.ops:
        error = apply_ops(state.agent.values, payload.ops, owned)
        if error is not None:
            _keep_as_extension(state, entry, error=error)
    if state.agent.schema_version != payload.schema_version:
        state.agent.schema_version = payload.schema_version


def _state_part(
    state: SessionState, entry: JournalEntry, payload: StatePayload
) -> StatePayload | None:
    """Keep one part; the whole entry's payload once its last part is here."""
    part = payload.part
    assert part is not None
    if payload.turn is not None and payload.turn not in state.pending:
        return None  # its turn has ended: nothing of it can apply any more
    parts = state.agent.parts
    known = parts.get(part.group)
    if known is None or known.count != part.count:
        known = StateParts(turn=payload.turn, count=part.count)
    if part.index != len(known.data):
        return None  # a repeat, or a part whose predecessors never came: never applied
    data = (*known.data, part.data)
    if len(data) < part.count:
        parts[part.group] = StateParts(turn=known.turn, count=known.count, data=data)
        return None
    parts.pop(part.group, None)
    try:
        whole = _STATE_READ_BACK.model_validate_json(base64.b64decode("".join(data), validate=True))
    except (ValidationError, binascii.Error) as exc:
        detail = _short(exc) if isinstance(exc, ValidationError) else f"data: {exc}"
        _keep_as_extension(state, entry, error=f"state parts of {part.group}: {detail}")
        return None
    assert isinstance(whole, StatePayload)
    if whole.part is not None or whole.turn != payload.turn:
        _keep_as_extension(state, entry, error=f"state parts of {part.group}: not one whole entry")
        return None
    return whole


def _drop_parts(state: SessionState, turn: int | None) -> None:
    parts = state.agent.parts
    for group in [group for group, known in parts.items() if known.turn == turn]:
        del parts[group]


def _ack(state: SessionState, entry: JournalEntry, payload: Payload) -> None:
    assert isinstance(payload, AckPayload)
    _start_turn(state, payload.turn)
    state.pending.pop(payload.turn, None)
    state.acked_turn = max(state.acked_turn, payload.turn)
    if state.agent.parts:
        _drop_parts(state, payload.turn)


def _control(state: SessionState, entry: JournalEntry, payload: Payload) -> None:
    assert isinstance(payload, ControlPayload)
    if payload.event is ControlEvent.EPOCH and payload.epoch is not None:
        state.epoch = payload.epoch
        state.owner = payload.owner
        if state.agent.parts:
            _drop_parts(state, None)


def _keep_as_extension(state: SessionState, entry: JournalEntry, error: str | None) -> None:
    state.extensions.append(
        ExtensionEntry(
            seq=entry.seq, kind=entry.kind, epoch=entry.epoch, payload=entry.payload, error=error
        )
    )


def _short(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


# The whole payload of a split entry: JSON text, so its values are JSON already.
_STATE_READ_BACK: Final = read_back_model(StatePayload)

_HANDLERS: Final[dict[str, _Handler]] = {
    EntryKind.MESSAGE: _Handler(MessagePayload, _message),
    EntryKind.TOOL_CALL: _Handler(ToolCallPayload, _tool_call),
    EntryKind.TOOL_RESULT: _Handler(ToolResultPayload, _tool_result),
    EntryKind.MEMORY: _Handler(MemoryPayload, _memory),
    EntryKind.FACT: _Handler(FactPayload, _fact),
    EntryKind.SCHEDULE: _Handler(SchedulePayload, _schedule),
    EntryKind.PROCESS: _Handler(ProcessPayload, _process),
    EntryKind.CREDENTIAL: _Handler(CredentialPayload, _credential),
    # Called with the fold's owned containers by ``_fold_one``.
    EntryKind.STATE: _Handler(StatePayload, _state),  # type: ignore[arg-type]
    EntryKind.ACK: _Handler(AckPayload, _ack),
    EntryKind.CONTROL: _Handler(ControlPayload, _control),
}
