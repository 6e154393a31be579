"""What a process's first LangGraph turn pays, paid before it is needed.

A process's first graph run costs about twice a later one: LangChain imports its
tracers when its first callback manager is configured, ABCs fill their subclass
caches, pydantic inspects default factories, LangGraph's Pregel loop and
``add_messages`` run for the first time. After a move, that first run is the new
owner's first turn, in the fence pause. ``prime`` runs the same code on throwaway
input — a graph of LangGraph's own (a node calling LangChain's fake chat model, which
asks for a tool, a ``ToolNode``, ``tools_condition``, ``MessagesState``) on an
in-memory saver, and the codec on a message of each kind — so that a warm spare pays
it before it is handed a session (``agent.on_start(saver.prime)``). No model and none
of the agent's tools are called; nothing is journaled.
"""

from __future__ import annotations

from typing import Any, Final

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from shadowpod.integrations.langgraph.codec import ValueCodec

_CALL: Final = "shadowpod-prime-call"


@tool
def _echo(text: str) -> str:
    """Answer ``text`` (the throwaway tool of the warm-up graph)."""
    return text


def _messages() -> list[BaseMessage]:
    call = {"name": "_echo", "args": {"text": "x"}, "id": _CALL}
    return [
        SystemMessage(content="s", id="prime-system"),
        HumanMessage(content="h", id="prime-human"),
        AIMessage(content="", tool_calls=[call], id="prime-call"),
        ToolMessage(content="x", tool_call_id=_CALL, name="_echo", id="prime-result"),
        AIMessage(content="a", id="prime-answer"),
    ]


def _model() -> FakeMessagesListChatModel:
    """LangChain's own fake chat model (no network): a tool call, then an answer."""
    call = {"name": "_echo", "args": {"text": "x"}, "id": _CALL}
    answers: list[BaseMessage] = [AIMessage(content="", tool_calls=[call]), AIMessage("done")]
    return FakeMessagesListChatModel(responses=answers)


async def prime(codec: ValueCodec) -> None:
    """Run the throwaway graph once (two model steps and a tool step, checkpointed as
    a turn's are) and the codec on each kind of message."""
    for message in _messages():
        codec.decode(codec.encode(message))
    model = _model()

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", ToolNode([_echo]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    graph = builder.compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "shadowpod-prime"}}
    start: MessagesState = {"messages": [SystemMessage(content="s"), HumanMessage(content="h")]}
    await graph.ainvoke(start, config, durability="sync")
    await graph.aget_state(config)
