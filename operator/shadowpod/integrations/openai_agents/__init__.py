"""The OpenAI Agents SDK on Shadowpod: its ``Session`` journaled, its tools through the
tool ledger, a save point before each tool call.

```python
from agents import Agent as OpenAIAgent, function_tool
from shadowpod.agent import Agent
from shadowpod.integrations.openai_agents import journaled_tools, openai_agents_handler

assistant = OpenAIAgent(name="support", tools=journaled_tools([lookup, send_email]))
agent = Agent("support-bot", version="1")
agent.on_message(openai_agents_handler(assistant))
agent.run()
```

Needs the ``openai-agents`` extra (``pip install 'shadowpod[openai-agents]'``).
"""

from shadowpod.integrations.openai_agents.runs import (
    journaled_tool,
    journaled_tools,
    openai_agents_handler,
    run_agent,
)
from shadowpod.integrations.openai_agents.session import ROOT, JournaledSession, NotInATurn

__all__ = [
    "ROOT",
    "JournaledSession",
    "NotInATurn",
    "journaled_tool",
    "journaled_tools",
    "openai_agents_handler",
    "run_agent",
]
