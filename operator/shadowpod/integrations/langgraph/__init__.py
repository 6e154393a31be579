"""LangGraph on Shadowpod: a graph becomes migratable by its checkpointer.

```python
from shadowpod.agent import Agent
from shadowpod.integrations.langgraph import ShadowpodSaver, graph_handler, tool_node

agent = Agent("support-bot", version="1")
saver = ShadowpodSaver()
builder.add_node("tools", tool_node(saver, [lookup, send_email], idempotent={"lookup"}))
agent.on_message(graph_handler(saver, builder.compile(checkpointer=saver)))
agent.on_shadow_ready(saver.warm)  # the conversation decoded before the fence
agent.on_start(saver.prime)  # a process's first graph run, paid before any move
agent.run()
```

Needs the ``langgraph`` extra (``pip install 'shadowpod[langgraph]'``).
"""

from shadowpod.integrations.langgraph.codec import ValueCodec
from shadowpod.integrations.langgraph.middleware import ToolJournalMiddleware
from shadowpod.integrations.langgraph.runs import (
    THREAD,
    UnjournaledTools,
    default_input,
    graph_handler,
    journal_tools,
    run_graph,
    thread_from_meta,
    tool_node,
)
from shadowpod.integrations.langgraph.saver import ROOT, NotInATurn, ShadowpodSaver

__all__ = [
    "ROOT",
    "THREAD",
    "NotInATurn",
    "ShadowpodSaver",
    "ToolJournalMiddleware",
    "UnjournaledTools",
    "ValueCodec",
    "default_input",
    "graph_handler",
    "journal_tools",
    "run_graph",
    "thread_from_meta",
    "tool_node",
]
