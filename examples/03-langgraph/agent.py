"""A LangGraph agent on Shadowpod: a ``StateGraph`` with a tool-calling chat model, a
``ToolNode`` with an idempotent ``lookup`` and a side-effecting ``send_email``, and a
human-in-the-loop approval — made migratable by its checkpointer.

    python examples/03-langgraph/agent.py [--version 2]

The chat model is a deterministic fake (no network, no API key): what it answers
depends only on the conversation, as a real model's would, not on which process
asks it. What it does with a message:

- ``lookup <city>`` — calls ``lookup`` (idempotent, may be repeated after a move);
- ``email <to> <text>`` — calls ``send_email`` (a side effect: takes
  ``$EMAIL_DELAY_S`` seconds; never repeated);
- ``both <city> <to>`` — both tools in one model answer (parallel tool calls);
- ``chain <to> <city>`` — two rounds: the email, then, seeing its result, the lookup;
- ``confirm <to> <text>`` — calls ``send_confirmed_email``, a tool that asks the user
  first from inside (``interrupt()`` in the tool): the next message answers it, the
  tool runs again from its start as LangGraph resumes a node, and sends on ``yes``;
- ``approve <text>`` — asks the user first (a LangGraph ``interrupt``); the next
  message (``yes`` or anything else) answers it, whichever process owns the session;
- anything else — ``you said: <text> (<n> messages so far)``, ``n`` counted in the
  graph's own history.

``$GRAPH`` picks how the graph is built, each as a developer would write it, with
``checkpointer=saver`` and nothing else to make it safe:

- ``custom`` (the default) — the ``StateGraph`` above, its tools in ``tool_node``;
- ``toolnode`` — the same graph with LangGraph's plain ``ToolNode``;
- ``react`` — LangGraph's prebuilt ``create_react_agent`` (no approval step);
- ``create_agent`` — LangChain 1.x's ``create_agent`` with ``ToolJournalMiddleware``;
- ``delta`` — the ``toolnode`` graph with its messages in LangGraph 1.2's
  ``DeltaChannel`` (beta: checkpoints store writes, not the list), for
  ``shadowpod bench langgraph`` to run on LangGraph's own ``SqliteSaver``.

Every tool call is journaled whichever it is (``graph_handler`` journals a plain
``ToolNode`` too): a new owner never repeats ``send_email``.

Each tool appends a line to ``$TOOL_LOG`` every time it runs (to count them).
Every reply carries ``meta.version``, ``meta.instance`` and ``meta.epoch``, and
``meta.decoded``: the conversation items this process has decoded inside turns (a
shadow decodes them before it is promoted: ``agent.on_shadow_ready(saver.warm)``,
unless ``LANGGRAPH_WARM=0``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt
from pydantic import JsonValue

from shadowpod.agent import Agent, Turn
from shadowpod.integrations.langgraph import (
    ShadowpodSaver,
    ToolJournalMiddleware,
    graph_handler,
    tool_node,
)

GRAPHS = ("custom", "toolnode", "react", "create_agent", "delta")


def _add_batch(messages: Any, batches: Sequence[Any]) -> Any:
    """``add_messages`` over a batch of writes (``DeltaChannel``'s reducer)."""
    for batch in batches:
        messages = add_messages(messages, batch)
    return messages


# Spelled as a call: its annotation is evaluated here, not looked up later by name (the
# example is loaded by path, not as a module LangGraph could find).
DeltaMessagesState = TypedDict(  # noqa: UP013
    "DeltaMessagesState", {"messages": Annotated[list[AnyMessage], DeltaChannel(_add_batch)]}
)


class ScriptedChatModel(BaseChatModel):
    """A tool-calling chat model whose answer is a function of the conversation."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._answer(messages))])

    def _answer(self, messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            human = messages[_last_human(messages)]
            if human.text.startswith("chain ") and last.name == "send_email":
                city = human.text.split()[-1]
                call = {"name": "lookup", "args": {"city": city}, "id": f"call-{human.id}-lookup"}
                return AIMessage(content="", tool_calls=[call])
            results = [m for m in messages[_last_human(messages) :] if isinstance(m, ToolMessage)]
            return AIMessage(content="; ".join(f"{m.name}: {m.text}" for m in results))
        asked = last.text
        command, _, rest = asked.partition(" ")
        base = f"call-{last.id}"
        calls: list[dict[str, Any]] = []
        if command == "lookup":
            calls = [{"name": "lookup", "args": {"city": rest}, "id": f"{base}-lookup"}]
        elif command == "email":
            to, _, text = rest.partition(" ")
            calls = [
                {"name": "send_email", "args": {"to": to, "text": text}, "id": f"{base}-email"}
            ]
        elif command == "confirm":
            to, _, text = rest.partition(" ")
            args = {"to": to, "text": text}
            calls = [{"name": "send_confirmed_email", "args": args, "id": f"{base}-confirm"}]
        elif command == "chain":  # two rounds: the email, then (seeing its result) the lookup
            to, _, city = rest.partition(" ")
            args = {"to": to, "text": city}
            calls = [{"name": "send_email", "args": args, "id": f"{base}-email"}]
        elif command == "both":
            city, _, to = rest.partition(" ")
            calls = [
                {"name": "lookup", "args": {"city": city}, "id": f"{base}-lookup"},
                {"name": "send_email", "args": {"to": to, "text": city}, "id": f"{base}-email"},
            ]
        if calls:
            return AIMessage(content="", tool_calls=calls)
        said = sum(isinstance(m, HumanMessage) for m in messages)
        return AIMessage(content=f"you said: {asked} ({said} messages so far)")


def _last_human(messages: list[BaseMessage]) -> int:
    return max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))


def _ran(line: str) -> None:
    with Path(os.environ.get("TOOL_LOG", "tools.log")).open("a") as log:
        log.write(f"{line} pid={os.getpid()}\n")


@tool
async def lookup(city: str) -> str:
    """Look up the weather of a city (no side effect: safe to repeat)."""
    _ran(f"lookup {city}")
    return f"sunny in {city}"


@tool
async def send_email(to: str, text: str) -> str:
    """Send an email (a side effect: never to be repeated)."""
    _ran(f"email {to} {text}")
    await asyncio.sleep(float(os.environ.get("EMAIL_DELAY_S", "0")))
    return f"sent to {to}"


@tool
async def send_confirmed_email(to: str, text: str) -> str:
    """Send an email once the user said yes (asks from inside the tool)."""
    # Before the interrupt: LangGraph runs it again when the answer resumes the tool.
    _ran(f"ask {to} {text}")
    answer = interrupt(f"email {text!r} to {to}? answer yes or no")
    if str(answer).strip().lower() != "yes":
        return "not sent"
    _ran(f"email {to} {text}")
    return f"sent to {to}"


TOOLS = [lookup, send_email, send_confirmed_email]


def build_graph(checkpointer: BaseCheckpointSaver[Any], kind: str = "custom") -> Any:
    """The graph ``kind`` (see the module's docstring), with any checkpointer
    (``shadowpod bench langgraph`` runs it with LangGraph's own ``SqliteSaver`` too)."""
    if kind not in GRAPHS:
        raise ValueError(f"GRAPH={kind!r}: one of {', '.join(GRAPHS)}")
    if kind == "react":
        from langgraph.prebuilt import create_react_agent

        with warnings.catch_warnings():  # moved to langchain.agents in 1.0, still there
            warnings.simplefilter("ignore")
            return create_react_agent(ScriptedChatModel(), TOOLS, checkpointer=checkpointer)
    if kind == "create_agent":
        from langchain.agents import create_agent

        middleware = (
            [ToolJournalMiddleware(checkpointer, idempotent={"lookup"})]
            if isinstance(checkpointer, ShadowpodSaver)
            else []
        )
        return create_agent(
            ScriptedChatModel(), TOOLS, checkpointer=checkpointer, middleware=middleware
        )
    model = ScriptedChatModel().bind_tools(TOOLS)
    tools = (
        tool_node(checkpointer, TOOLS, idempotent={"lookup"})
        if kind == "custom" and isinstance(checkpointer, ShadowpodSaver)
        else ToolNode(TOOLS)
    )

    async def call_model(state: Any) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def approval(state: Any) -> dict[str, Any]:
        text = state["messages"][-1].text.partition(" ")[2]
        answer = interrupt(f"send {text!r}? answer yes or no")
        verdict = "approved" if str(answer).strip().lower() == "yes" else "cancelled"
        return {"messages": [AIMessage(content=f"{verdict}: {text}")]}

    def route(state: Any) -> str:
        return "approval" if state["messages"][-1].text.startswith("approve ") else "model"

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(
        DeltaMessagesState if kind == "delta" else MessagesState
    )
    builder.add_node("model", call_model)
    builder.add_node("tools", tools)
    builder.add_node("approval", approval)
    builder.add_conditional_edges(START, route, ["approval", "model"])
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    builder.add_edge("approval", END)
    return builder.compile(checkpointer=checkpointer)


def make_agent(version: str) -> Agent:
    agent = Agent("langgraph-demo", version=version)
    saver = ShadowpodSaver()
    graph = build_graph(saver, os.environ.get("GRAPH", "custom"))

    def meta(turn: Turn) -> dict[str, JsonValue]:
        return {
            "version": version,
            "instance": turn.instance,
            "epoch": turn.epoch,
            "decoded": saver.decoded_in_turns,
        }

    agent.on_message(graph_handler(saver, graph, meta=meta, idempotent={"lookup"}))
    agent.on_start(saver.prime)  # a process's first graph run, paid before any move
    if os.environ.get("LANGGRAPH_WARM", "1") != "0":  # 0: to measure without it
        agent.on_shadow_ready(saver.warm)  # the conversation decoded before the fence
    return agent


if __name__ == "__main__":
    version = sys.argv[sys.argv.index("--version") + 1] if "--version" in sys.argv else "1"
    make_agent(version).run()
