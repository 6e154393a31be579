"""A graph run as a Shadowpod turn: its input, its tools, its interrupts, its redo.

- ``run_graph`` runs the graph for one turn on the session's thread, its
  checkpoints saved into the turn (``durability="sync"``: each is in the turn's
  values before the next step starts). A message that answers an interrupt resumes
  the graph (``Command(resume=...)``). A turn redone by a new owner (the old one died
  mid-turn) resumes the run from the checkpoint saved with its last tool call,
  instead of starting it again.
- ``tool_node`` is LangGraph's ``ToolNode`` with every call journaled by its
  LangChain ``tool_call_id``: intent before, result after (``Turn.call``), the
  checkpoint that asked for it saved with the intent. After an owner change, a call
  with a result is answered from the journal; one with an intent only is repeated
  if the tool is idempotent, and otherwise becomes an error ``ToolMessage`` saying
  so — the graph's history stays whole, and the side effect is never repeated.
  An ``interrupt()`` inside a tool stops the graph to ask, journaled as the call's
  ``interrupted`` result (not its error); the answer resumes the graph, which runs the
  tool again from its start as LangGraph does, as a new call of the answering turn.
- ``graph_handler`` is the whole ``@agent.on_message`` handler: one line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Final

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphInterrupt
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.pregel import Pregel
from langgraph.types import Command
from pydantic import JsonValue

from shadowpod.agent import ToolAbandoned, ToolFailed, Turn
from shadowpod.integrations.langgraph.saver import ShadowpodSaver

THREAD: Final = "main"
TURN_KEY: Final = "shadowpod_turn"  # in each checkpoint's metadata: the turn that wrote it


def tool_node(
    saver: ShadowpodSaver,
    tools: Sequence[BaseTool | Callable[..., Any]],
    *,
    idempotent: Collection[str] = (),
    **options: Any,
) -> ToolNode:
    """A ``ToolNode`` whose calls are journaled. ``idempotent`` names the tools that
    are safe to repeat when their outcome is unknown (a tool whose ``metadata`` has
    ``idempotent: True`` is too); any other is never run twice."""
    declared = frozenset(idempotent)

    async def journaled(
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        turn = saver.turn
        if turn is None:  # run outside Shadowpod: nothing to journal
            return await execute(request)
        call = request.tool_call
        name, call_id = call["name"], call["id"] or ""
        metadata = request.tool.metadata if request.tool is not None else None
        safe = name in declared or bool((metadata or {}).get("idempotent"))
        # The checkpoint holding the model's answer goes with the intent: a new owner
        # redoing this turn resumes from it, so asks for the same call ids.
        turn.save_state()

        async def run() -> JsonValue:
            return saver.codec.encode(await execute(request))

        try:
            args = saver.codec.encode(call["args"])
            assert isinstance(args, dict)
            recorded = await turn.call(
                f"{turn.seq}:{call_id}",
                name,
                args,
                run,
                idempotent=safe,
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

    return ToolNode(tools, awrap_tool_call=journaled, **options)


def default_input(turn: Turn) -> dict[str, Any]:
    # The id is the turn's: were the input applied twice, ``add_messages`` would
    # replace the message, not add it again.
    return {"messages": [HumanMessage(content=turn.content, id=f"turn-{turn.seq}")]}


async def run_graph(
    saver: ShadowpodSaver,
    graph: Pregel[Any, Any, Any, Any],
    turn: Turn,
    input: Any,
    *,
    thread_id: str = THREAD,
) -> dict[str, Any]:
    """Run ``graph`` for this turn; its result (with ``__interrupt__`` when it stopped
    to ask)."""
    config: RunnableConfig = {
        "configurable": {"thread_id": thread_id},
        "metadata": {TURN_KEY: turn.seq},
    }
    with saver.bound(turn):
        state = await graph.aget_state(config)
        if state.metadata is not None and state.metadata.get(TURN_KEY) == turn.seq:
            if not state.next:  # the run was over before the owner changed
                return dict(state.values)
            payload: Any = None  # redone: resume the run from its last checkpoint
        elif state.interrupts:
            payload = Command(resume=turn.content)
        else:
            payload = input
        result = await graph.ainvoke(payload, config, durability="sync")
    assert isinstance(result, dict)
    return result


def graph_handler(
    saver: ShadowpodSaver,
    graph: Pregel[Any, Any, Any, Any],
    *,
    input: Callable[[Turn], Any] = default_input,
    meta: Callable[[Turn], dict[str, JsonValue]] | None = None,
    thread_id: str = THREAD,
) -> Callable[[Turn], Awaitable[None]]:
    """``@agent.on_message`` for a chat graph: each message a run of ``graph``; the
    reply its last message, or the question of an interrupt (``meta.interrupt``)."""

    async def handle(turn: Turn) -> None:
        result = await run_graph(saver, graph, turn, input(turn), thread_id=thread_id)
        extra = meta(turn) if meta is not None else {}
        if interrupts := result.get("__interrupt__"):
            await turn.reply(str(interrupts[0].value), interrupt=True, **extra)
            return
        messages = result.get("messages") or []
        last = messages[-1] if messages else None
        text = last.text if isinstance(last, BaseMessage) else str(last)
        await turn.reply(text, **extra)

    return handle
