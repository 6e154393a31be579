"""LangChain tool calls journaled by their ``tool_call_id``: the one wrapper that
``tool_node``, ``journal_tools`` (a graph's own ``ToolNode``s) and
``ToolJournalMiddleware`` (``create_agent``) put around a call.

Each call is a ``Turn.call``: intent before, result after, the checkpoint that asked
for it saved with the intent (so a new owner redoing the turn resumes from the model's
answer and asks for the same call ids). After an owner change, a call with a result is
answered from the journal; one with an intent only is repeated if the tool is
idempotent, and otherwise becomes an error ``ToolMessage`` saying so — the graph's
history stays whole, and the side effect is never repeated. An ``interrupt()``
inside a tool stops the graph to ask, journaled as the call's ``interrupted`` result.

A call wrapped twice (a graph whose ``ToolNode`` already has the middleware, found
again by ``journal_tools``) is journaled once, by the outer wrapper.

``tool_call_id`` is what the tool is given (``InjectedToolCallId``, ``ToolRuntime``)
and what the journal knows the call by: it is the same when a new owner repeats the
call, so a tool that hands it to its provider as an idempotency key is idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from contextvars import ContextVar
from typing import Any, Final

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphInterrupt
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from pydantic import JsonValue

from shadowpod.agent import ToolAbandoned, ToolFailed
from shadowpod.integrations.langgraph.saver import ShadowpodSaver

logger = logging.getLogger(__name__)

ToolResult = ToolMessage | Command[Any]
Execute = Callable[[ToolCallRequest], Awaitable[ToolResult]]
AsyncToolWrapper = Callable[[ToolCallRequest, Execute], Awaitable[ToolResult]]

JOURNALED: Final = "_shadowpod_journaled"  # set on the wrappers this module makes
# The call being journaled in this task: an inner wrapper of the same call passes through.
_journaling: ContextVar[str | None] = ContextVar("shadowpod-journaling-call", default=None)


def is_idempotent(request: ToolCallRequest, declared: Collection[str]) -> bool:
    """Declared by name, or by the tool's ``metadata={"idempotent": True}``."""
    metadata = request.tool.metadata if request.tool is not None else None
    return request.tool_call["name"] in declared or bool((metadata or {}).get("idempotent"))


def journaled_calls(saver: ShadowpodSaver, idempotent: Collection[str] = ()) -> AsyncToolWrapper:
    """An ``awrap_tool_call`` that journals each call (see the module's docstring)."""
    declared = frozenset(idempotent)

    async def journaled(request: ToolCallRequest, execute: Execute) -> ToolResult:
        turn = saver.turn
        call = request.tool_call
        name, call_id = call["name"], call["id"] or ""
        if turn is None or _journaling.get() == call_id:
            # Outside Shadowpod (nothing to journal), or already journaled around us.
            return await execute(request)
        saver.journaled_calls.add(call_id)
        # What the graph holds, settled (in-place edits journaled) and saved with the
        # intent: a new owner redoing this turn resumes from it, so it asks for the
        # same call ids.
        saver.settle()
        turn.save_state()

        async def run() -> JsonValue:
            token = _journaling.set(call_id)
            try:
                return saver.codec.encode(await execute(request))
            finally:
                _journaling.reset(token)

        try:
            args = saver.codec.encode(call["args"])
            assert isinstance(args, dict)
            recorded = await turn.call(
                f"{turn.seq}:{call_id}",
                name,
                args,
                run,
                idempotent=is_idempotent(request, declared),
                # ``interrupt()`` in the tool: the graph stops to ask, the call is not
                # over (LangGraph runs the tool again from its start when resumed).
                interrupts=(GraphInterrupt,),
            )
        except ToolAbandoned as exc:
            return ToolMessage(
                content=f"Not run again: {exc}. Tell the user it may or may not have happened.",
                name=name,
                tool_call_id=call_id,
                status="error",
            )
        except ToolFailed as exc:
            return ToolMessage(
                content=f"Error: {exc.error}", name=name, tool_call_id=call_id, status="error"
            )
        result = saver.codec.decode(recorded)
        assert isinstance(result, ToolMessage | Command)
        return result

    setattr(journaled, JOURNALED, True)
    return journaled


def around(outer: AsyncToolWrapper, inner: AsyncToolWrapper | None) -> AsyncToolWrapper:
    """``outer`` around ``inner`` (a ``ToolNode``'s own wrapper, if it has one)."""
    if inner is None:
        return outer

    async def both(request: ToolCallRequest, execute: Execute) -> ToolResult:
        return await outer(request, lambda again: inner(again, execute))

    setattr(both, JOURNALED, True)
    return both
