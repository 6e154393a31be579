"""``ToolJournalMiddleware``: LangChain 1.x's ``create_agent`` with its tool calls
journaled, for an agent built with ``create_agent`` (which takes no ``ToolNode``)::

    graph = create_agent(
        model, tools, checkpointer=saver, middleware=[ToolJournalMiddleware(saver)]
    )

``graph_handler`` / ``run_graph`` journal the agent's ``ToolNode`` without it too
(``journal_tools``); the middleware says so in the graph's own definition, and places
the journal where the developer wants it among other middleware (first = outermost:
a retry middleware put after it retries inside one journaled call).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import AgentState
from langgraph.prebuilt.tool_node import ToolCallRequest

from shadowpod.integrations.langgraph.saver import ShadowpodSaver
from shadowpod.integrations.langgraph.tools import Execute, ToolResult, journaled_calls


class ToolJournalMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Each tool call journaled by its ``tool_call_id`` (``shadowpod.integrations.
    langgraph.tools``): never repeated by a new owner unless ``idempotent`` names it
    (or its ``metadata`` has ``idempotent: True``)."""

    def __init__(self, saver: ShadowpodSaver, *, idempotent: Collection[str] = ()) -> None:
        super().__init__()
        self._journaled = journaled_calls(saver, idempotent)

    async def awrap_tool_call(self, request: ToolCallRequest, handler: Execute) -> ToolResult:
        return await self._journaled(request, handler)
