"""The context a handler gets: one turn, its reads and its (journaled) writes.

Writes are buffered and journaled with the turn's ack in one append — a turn's
outputs land together or not at all. Tool calls are the exception: the intent is
journaled (durably) before the tool runs and the result right after, so a new owner
can tell a call that finished from one whose side effect is uncertain.

Output ids are derived from the turn (``t<seq>:<n>``), so a retried append after a
lost answer is absorbed by the journal instead of duplicated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from pydantic import JsonValue

from shadowpod.agent.appends import fitting_id
from shadowpod.agent.tools import ToolSpec
from shadowpod.agent.values import changed_in_place, contents, state_path
from shadowpod.domain.deltas import Owned, apply_ops, diff
from shadowpod.domain.entries import NewEntry
from shadowpod.domain.payloads import (
    MAX_STATE_OPS,
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
    StateKey,
    StateOp,
    StateOpKind,
    StatePayload,
    ToolCallPayload,
    ToolResultPayload,
    ToolStatus,
)
from shadowpod.domain.state import CallStatus, PendingInbound, SessionState, TranscriptMessage

if TYPE_CHECKING:
    from shadowpod.agent.processes import ProcessRegistry


Append = Callable[[Sequence[NewEntry]], Awaitable[list[int]]]  # journal now, at our epoch
_DELETED: Final = object()


class Superseded(Exception):
    """This instance's epoch is no longer the session's: it must stop."""


class ToolAbandoned(Exception):
    """A tool call from before an owner change whose outcome is unknown and which is
    not idempotent: it was not repeated, and that decision is in the journal."""

    def __init__(self, call_id: str, tool: str) -> None:
        super().__init__(
            f"tool {tool!r} (call {call_id}) may or may not have run before the owner "
            "changed; it is not declared idempotent, so it was not repeated"
        )
        self.call_id = call_id
        self.tool = tool


class ToolFailed(Exception):
    def __init__(self, call_id: str, tool: str, error: str) -> None:
        super().__init__(f"tool {tool!r} (call {call_id}) failed: {error}")
        self.call_id = call_id
        self.tool = tool
        self.error = error


class OwnerContext:
    """What the agent can do when it becomes owner, outside any turn."""

    def __init__(
        self,
        *,
        state: SessionState,
        epoch: int,
        instance: str,
        append: Append,
        processes: ProcessRegistry,
        turn: int | None = None,
    ) -> None:
        self.state = state
        self.epoch = epoch
        self.instance = instance
        self._append = append
        self._processes = processes
        self._turn = turn
        self._outputs: list[NewEntry] = []
        # Output ids are derived, so a retried append is absorbed, not duplicated.
        self._id_prefix = f"t{turn}" if turn is not None else f"owner:{epoch}:{instance}"
        self._output_no = 0

    # --- writes -----------------------------------------------------------------------

    def _emit(self, payload: Payload) -> None:
        self._output_no += 1
        entry_id = fitting_id(f"{self._id_prefix}:{self._output_no}")
        self._outputs.append(NewEntry.of(payload, id=entry_id))

    def schedule(
        self, schedule_id: str, *, every_s: float, content: str = "", wake: bool = False
    ) -> None:
        """Fire ``content`` into this session every ``every_s`` seconds, whoever owns it;
        with ``wake``, a fire while the session is suspended wakes it (else it waits)."""
        self._emit(
            SchedulePayload.setting(
                schedule_id, every_s=every_s, content=content, wake=wake, turn=self._turn
            )
        )

    def cancel_schedule(self, schedule_id: str) -> None:
        self._emit(SchedulePayload(schedule_id=schedule_id, op=ScheduleOp.CANCEL, turn=self._turn))

    async def spawn(self, name: str, command: Sequence[str]) -> int:
        """Start a background process; it is inventoried and drained when this owner goes."""
        pid = await self._processes.spawn(name, command)
        self._emit(
            ProcessPayload(
                name=name, op=ProcessOp.STARTED, command=list(command), pid=pid, turn=self._turn
            )
        )
        return pid

    def take_outputs(self) -> list[NewEntry]:
        outputs, self._outputs = self._outputs, []
        return outputs


class Turn(OwnerContext):
    """One inbound entry being processed by the owner."""

    def __init__(
        self,
        *,
        tools: Mapping[str, ToolSpec],
        state_schema: int,
        state: SessionState,
        inbound: PendingInbound,
        values: dict[str, JsonValue],
        epoch: int,
        instance: str,
        append: Append,
        processes: ProcessRegistry,
        replaces_values: bool = False,
        version: str = "",
    ) -> None:
        super().__init__(
            state=state,
            epoch=epoch,
            instance=instance,
            append=append,
            processes=processes,
            turn=inbound.seq,
        )
        self.inbound = inbound
        self.version = version  # the agent's (``Agent(version=...)``): replies say it
        self._tools = tools
        self._state_schema = state_schema
        # The agent's own state, to change. Its containers are shared with the session's
        # state: build new ones (``[*old, new]``) or use ``append``/``set``/``delete``,
        # never change one in place. Typed ``Any`` so that what a framework's serializer
        # returns (``list[dict[str, Any]]``) goes in without a cast; it is checked to be
        # JSON when the turn's state entry is written.
        self.values: dict[str, Any] = dict(values)
        self._owned: Owned = {}  # containers of ``values`` this turn copied itself
        # Ops made by ``append``/``set``/``delete``, journaled as they are, and what each
        # top-level key they changed held after them: a key still holding that is not
        # compared again (a large log changed by a few ops costs those ops, not a walk).
        self._ops: list[StateOp] = []
        self._op_roots: dict[str, object] = {}
        self._state_saves = 0
        # Values migrated to this agent's schema for the turn must replace the stored
        # ones whole: a partial update would mix two schemas.
        self._values_before: dict[str, JsonValue] | None = None if replaces_values else dict(values)
        # What each value held as the turn began, by content: one changed in place
        # (``values["memo"]["n"] += 1``) is then journaled whole, not lost (the owner
        # would hold it, the journal not).
        self._contents_before = {} if replaces_values else contents(values)
        self._memory: dict[str, object] = {}
        self._facts: dict[str, object] = {}
        self._tool_calls = 0

    # --- reads ------------------------------------------------------------------------

    @property
    def seq(self) -> int:
        return self.inbound.seq

    @property
    def content(self) -> str:
        return self.inbound.content

    @property
    def role(self) -> Role:
        return self.inbound.role

    @property
    def schedule_id(self) -> str | None:
        """Set when this turn is a schedule firing."""
        return self.inbound.schedule_id

    @property
    def transcript(self) -> Sequence[TranscriptMessage]:
        return self.state.transcript

    @property
    def memory(self) -> Mapping[str, JsonValue]:
        """Memory as this turn sees it: its own writes over the session's memory."""
        merged: dict[str, object] = dict(self.state.memory)
        merged.update(self._memory)
        return MappingProxyType({k: v for k, v in merged.items() if v is not _DELETED})  # type: ignore[misc]

    @property
    def facts(self) -> Mapping[str, str]:
        merged: dict[str, object] = {k: f.text for k, f in self.state.facts.items()}
        merged.update(self._facts)
        return MappingProxyType({k: str(v) for k, v in merged.items() if v is not _DELETED})

    # --- writes -----------------------------------------------------------------------

    async def reply(self, content: str, **meta: JsonValue) -> None:
        self._emit(MessagePayload(role=Role.ASSISTANT, content=content, meta=meta, turn=self.seq))

    def remember(self, key: str, value: JsonValue) -> None:
        self._memory[key] = value
        self._emit(MemoryPayload(key=key, op=MemoryOp.SET, value=value, turn=self.seq))

    def forget(self, key: str) -> None:
        self._memory[key] = _DELETED
        self._emit(MemoryPayload(key=key, op=MemoryOp.DELETE, turn=self.seq))

    def learn(self, fact_id: str, text: str) -> None:
        """A durable fact: a correction or rule that must outlive compaction and upgrades."""
        self._facts[fact_id] = text
        self._emit(FactPayload(fact_id=fact_id, op=FactOp.ADD, text=text, turn=self.seq))

    def unlearn(self, fact_id: str) -> None:
        self._facts[fact_id] = _DELETED
        self._emit(FactPayload(fact_id=fact_id, op=FactOp.RETRACT, turn=self.seq))

    async def tool(self, name: str, args: dict[str, JsonValue] | None = None) -> JsonValue:
        """Run a registered tool: intent journaled before, result journaled after.

        A call this turn already made under a previous owner is not run again: its
        recorded result is returned; if only its intent was recorded, it is repeated
        only when the tool is declared idempotent (``ToolAbandoned`` otherwise).
        """
        spec = self._tools.get(name)
        if spec is None:
            raise KeyError(f"no tool named {name!r}; register it with @agent.tool()")
        self._tool_calls += 1
        call_args = args or {}

        async def run() -> JsonValue:
            return await spec.fn(**call_args)

        return await self.call(
            f"{self.seq}:{self._tool_calls}", name, call_args, run, idempotent=spec.idempotent
        )

    async def call(
        self,
        call_id: str,
        tool: str,
        args: dict[str, JsonValue],
        run: Callable[[], Awaitable[JsonValue]],
        *,
        idempotent: bool,
        interrupts: tuple[type[BaseException], ...] = (),
    ) -> JsonValue:
        """Run ``run`` as the tool call ``call_id`` (a framework's own id, such as
        LangChain's ``tool_call_id``, unique in the session): the same journaling and
        the same answers after an owner change as ``tool``. ``ToolAbandoned`` when it
        may have run and must not be repeated, ``ToolFailed`` when it failed.

        ``interrupts``: what ``run`` raises to stop and ask (LangGraph's
        ``GraphInterrupt``): journaled as an ``interrupted`` result — no outcome, no
        error — and raised again as it is; the call may run again once answered."""
        known = self.state.tools.calls.get(call_id)
        if known is not None and known.status is CallStatus.OK:
            return known.result
        if known is not None and known.status is CallStatus.ERROR:
            raise ToolFailed(call_id, tool, known.error or "")
        if known is not None and known.status is CallStatus.ABANDONED:
            raise ToolAbandoned(call_id, tool)
        if known is not None and known.status is CallStatus.PENDING and not idempotent:
            await self._record_result(
                call_id, ToolStatus.ABANDONED, error="outcome unknown after an owner change"
            )
            raise ToolAbandoned(call_id, tool)
        # Run again after an interrupt: a new intent, so that a death during this run
        # leaves the call uncertain again, never taken for merely asked.
        again = "" if known is None else f":after-{known.result_seq}"
        if known is None or known.status is CallStatus.INTERRUPTED:
            intent = NewEntry.of(
                ToolCallPayload(
                    call_id=call_id, tool=tool, args=args, idempotent=idempotent, turn=self.seq
                ),
                id=fitting_id(f"tool:{call_id}{again}"),
            )
            await self._append([*self.take_outputs(), intent])
        try:
            result = await run()
        except interrupts as exc:
            await self._record_result(
                call_id,
                ToolStatus.INTERRUPTED,
                result=str(exc)[:1000],
                id=fitting_id(f"tool-interrupt:{call_id}{again}"),
            )
            raise
        except Exception as exc:
            await self._record_result(
                call_id, ToolStatus.ERROR, error=f"{type(exc).__name__}: {exc}"
            )
            raise ToolFailed(call_id, tool, str(exc)) from exc
        await self._record_result(call_id, ToolStatus.OK, result=result)
        return result

    async def _record_result(
        self,
        call_id: str,
        status: ToolStatus,
        *,
        result: JsonValue = None,
        error: str | None = None,
        id: str | None = None,
    ) -> None:
        entry = NewEntry.of(
            ToolResultPayload(
                call_id=call_id, status=status, result=result, error=error, turn=self.seq
            ),
            id=id or fitting_id(f"tool-result:{call_id}"),
        )
        await self._append([*self.take_outputs(), entry])

    def shared(self, key: str) -> Any:
        """The value at ``key`` as the session's state holds it, not copied — for code
        that changes it only with ``append`` / ``set`` / ``delete`` (a framework's
        checkpointer): it must never change it in place."""
        return dict.get(self.values, key)

    def append(self, path: str | Sequence[StateKey], *items: object) -> None:
        """Add ``items`` at the end of the list at ``path`` (a key of ``values``, or a
        path into them), made if missing. Journaled as an append of the items alone."""
        self._change(StateOp(op=StateOpKind.APPEND, path=state_path(path), items=list(items)))

    def set(self, path: str | Sequence[StateKey], value: object) -> None:
        """Set ``value`` at ``path`` (keys of objects, indexes of lists). Values are
        checked to be JSON here, so what a serializer returns needs no cast."""
        self._change(StateOp(op=StateOpKind.SET, path=state_path(path), value=value))

    def delete(self, path: str | Sequence[StateKey]) -> None:
        """Remove the key (or list item) at ``path``; nothing if it is not there."""
        self._change(StateOp(op=StateOpKind.DELETE, path=state_path(path)))

    def _change(self, op: StateOp) -> None:
        # Copy-on-write, as the reducer: the containers on the path are copied once per
        # turn, so the session's state (and ``values`` as the turn found them) stay as
        # they were.
        error = apply_ops(self.values, [op], self._owned)
        if error is not None:
            raise ValueError(f"cannot {op.op.value} {error.partition(': ')[2]}")
        self._ops.append(op)
        key = op.path[0]
        assert isinstance(key, str)
        self._op_roots[key] = self.values.get(key, _DELETED)

    def save_state(self) -> None:
        """Journal the change of ``values`` so far with this turn's next write (a tool
        call's intent, or the end of the turn), not only when the turn ends.

        For a framework that resumes from its own saved state (LangGraph's
        checkpoints): if this owner dies mid-turn, the next owner redoes the turn on
        ``values`` as saved here — e.g. from the model's answer that asked for a tool,
        so it asks for the same calls, under the same ids. An agent that recomputes
        its state from the turn's start must not call it.
        """
        # The epoch is in the id: a save is relative to the state its writer found, and a
        # turn redone by a new owner (from what the old one saved of it) saves anew —
        # never to be taken for a repeat of the old owner's save of the same number.
        entry_id = f"t{self.seq}:e{self.epoch}:state:{self._state_saves + 1}"
        if (entry := self._state_change(entry_id)) is None:
            return
        self._state_saves += 1
        self._outputs.append(entry)
        self._values_before = dict(self.values)
        self._contents_before = contents(self.values)
        self._owned = {}  # the containers of ``values`` are now shared with what was saved
        self._ops, self._op_roots = [], {}

    def state_entry(self) -> NewEntry | None:
        # As every output of a turn: a turn redone after its old owner journaled this
        # (its ack then lost) is absorbed as a repeat.
        return self._state_change(f"t{self.seq}:state")

    def _state_change(self, entry_id: str) -> NewEntry | None:
        """The agent-state change of this turn, if ``values`` changed (or were migrated).

        Written as deltas (``shadowpod.domain.deltas``): a list that grew is journaled
        as its new items, a changed key as its new value, so a turn's write is the size
        of its change, not of the state.
        """
        before = self._values_before
        if before is None:  # migrated: replaces the stored values whole
            payload = StatePayload(
                values=self.values, replace=True, schema_version=self._state_schema, turn=self.seq
            )
            return NewEntry.of(payload, id=entry_id)
        # Keys changed by ops alone are journaled by those ops; any other key (one
        # assigned since, too) by comparing what it held before and holds now.
        by_ops = {k for k, root in self._op_roots.items() if self.values.get(k, _DELETED) is root}
        explicit = [op for op in self._ops if op.path[0] in by_ops]
        # A value changed in place is set whole: its old content is gone, and ops made
        # against it would be applied twice to the owner's own (already changed) state.
        in_place = changed_in_place(before, self._contents_before) - by_ops
        whole = [
            StateOp(op=StateOpKind.SET, path=[k], value=self.values[k])
            if k in self.values
            else StateOp(op=StateOpKind.DELETE, path=[k])
            for k in sorted(in_place)
        ]
        skip = by_ops | in_place
        rest = diff(
            {k: v for k, v in before.items() if k not in skip},
            {k: v for k, v in self.values.items() if k not in skip},
        )
        ops = None if rest is None else [*explicit, *whole, *rest]
        if ops == []:
            return None
        if ops is not None and len(ops) > MAX_STATE_OPS:
            ops = None
        schema = self._state_schema
        payload = (
            StatePayload(values=self.values, replace=True, schema_version=schema, turn=self.seq)
            if ops is None
            else StatePayload(ops=ops, schema_version=schema, turn=self.seq)
        )
        return NewEntry.of(payload, id=entry_id)
