"""A graph run as a Shadowpod turn: its input, its tools, its interrupts, its redo.

- ``run_graph`` runs the graph for one turn on the session's thread, its
  checkpoints saved into the turn (``durability="sync"``: each is in the turn's
  values before the next step starts). A message that answers an interrupt resumes
  the graph (``Command(resume=...)``). A turn redone by a new owner (the old one died
  mid-turn) resumes the run from the checkpoint saved with its last tool call,
  instead of starting it again.
- Every ``ToolNode`` of the graph — a plain one, ``create_react_agent``'s,
  ``create_agent``'s — has its calls journaled by their LangChain ``tool_call_id``
  before the graph first runs (``journal_tools``; ``shadowpod.integrations.langgraph.
  tools`` says how): safe by default. ``tool_node`` builds one journaled from the start.
  An ``interrupt()`` inside a tool stops the graph to ask, journaled as the call's
  ``interrupted`` result (not its error); the answer resumes the graph, which runs the
  tool again from its start as LangGraph does, as a new call of the answering turn.
- ``graph_handler`` is the whole ``@agent.on_message`` handler: one line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Final
from weakref import WeakSet

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.pregel import Pregel
from langgraph.types import Command
from pydantic import JsonValue

from shadowpod.agent import Turn
from shadowpod.integrations.langgraph.saver import ShadowpodSaver
from shadowpod.integrations.langgraph.tools import JOURNALED, around, journaled_calls

THREAD: Final = "main"
TURN_KEY: Final = "shadowpod_turn"  # in each checkpoint's metadata: the turn that wrote it
# Graphs whose ToolNodes ``run_graph`` has journaled (a graph is built once, run often).
_journaled_graphs: WeakSet[Pregel[Any, Any, Any, Any]] = WeakSet()


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
    inner = options.pop("awrap_tool_call", None)
    return ToolNode(
        tools, awrap_tool_call=around(journaled_calls(saver, idempotent), inner), **options
    )


def journal_tools(
    saver: ShadowpodSaver, graph: Pregel[Any, Any, Any, Any], *, idempotent: Collection[str] = ()
) -> list[str]:
    """Journal the calls of every ``ToolNode`` of ``graph`` (and of its subgraphs) not
    journaled yet — a plain ``ToolNode``, ``create_react_agent``'s, ``create_agent``'s —
    as ``tool_node`` does; ``run_graph`` (so ``graph_handler``) does it once per graph.
    The names of the nodes it changed.

    Refuses (``UnjournaledTools``) a ``ToolNode`` with only a synchronous
    ``wrap_tool_call``: an agent's graph runs asynchronously, and the journal's wrapper
    cannot call a synchronous one around the tool."""
    changed: list[str] = []
    for name, node in graph.nodes.items():
        bound = node.bound
        if isinstance(bound, Pregel):
            changed += [
                f"{name}/{inner}" for inner in journal_tools(saver, bound, idempotent=idempotent)
            ]
            continue
        if not isinstance(bound, ToolNode):
            continue
        wrapper = bound._awrap_tool_call
        if wrapper is not None and getattr(wrapper, JOURNALED, False):
            continue
        if wrapper is None and bound._wrap_tool_call is not None:
            raise UnjournaledTools(
                f"the ToolNode {name!r} has a synchronous wrap_tool_call only, so its calls "
                "cannot be journaled around it: give it an async awrap_tool_call as well, or "
                "build it with shadowpod.integrations.langgraph.tool_node(...)"
            )
        bound._awrap_tool_call = around(journaled_calls(saver, idempotent), wrapper)
        changed.append(name)
    return changed


class UnjournaledTools(ValueError):
    pass


def thread_from_meta(turn: Turn) -> str:
    """The thread a message names in its ``meta.thread`` (a string), else ``THREAD``."""
    thread = turn.inbound.meta.get("thread")
    return thread if isinstance(thread, str) and thread else THREAD


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
    idempotent: Collection[str] = (),
) -> dict[str, Any]:
    """Run ``graph`` for this turn on the thread ``thread_id``; its result (with
    ``__interrupt__`` when it stopped to ask). Its ``ToolNode``s are journaled first
    (``journal_tools``), ``idempotent`` naming the tools safe to repeat."""
    if graph not in _journaled_graphs:
        journal_tools(saver, graph, idempotent=idempotent)
        _journaled_graphs.add(graph)
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
    thread_id: str | Callable[[Turn], str] = THREAD,
    idempotent: Collection[str] = (),
) -> Callable[[Turn], Awaitable[None]]:
    """``@agent.on_message`` for a chat graph: each message a run of ``graph``; the
    reply its last message, or the question of an interrupt (``meta.interrupt``).

    Every reply carries ``meta.version`` (the agent's version: what ``shadowpod demo``
    and ``bench migrate`` count replies by) and whatever ``meta`` adds. ``thread_id``:
    the graph's thread, or a function of the turn choosing one (``thread_from_meta``:
    the message's ``meta.thread``) — several conversations in one session, each moved
    with it. ``idempotent``: the tools safe to repeat (``journal_tools``)."""

    async def handle(turn: Turn) -> None:
        thread = thread_id(turn) if callable(thread_id) else thread_id
        result = await run_graph(
            saver, graph, turn, input(turn), thread_id=thread, idempotent=idempotent
        )
        extra: dict[str, JsonValue] = {"version": turn.version}
        if meta is not None:
            extra.update(meta(turn))
        if interrupts := result.get("__interrupt__"):
            await turn.reply(str(interrupts[0].value), interrupt=True, **extra)
            return
        messages = result.get("messages") or []
        last = messages[-1] if messages else None
        text = last.text if isinstance(last, BaseMessage) else str(last)
        await turn.reply(text, **extra)

    return handle
