"""``Agent``: what an agent author declares — handlers, tools, state schema migrations —
and ``run()``, which runs it as an instance of a session.

agent = Agent("support-bot", version="2", state_schema=2)

@agent.on_message
async def answer(turn: Turn) -> None:
    await turn.reply(f"you said {turn.content}")

@agent.migration(from_version=1)
def split_profile(values: dict[str, JsonValue]) -> dict[str, JsonValue]:
    return {"profile": {"name": values.get("name")}}

if __name__ == "__main__":
    agent.run()
"""

from __future__ import annotations

from shadowpod.agent.declaration import AgentDeclaration
from shadowpod.agent.main import run_agent


class Agent(AgentDeclaration):
    def run(self) -> None:
        """Run this agent with the settings of its environment (see ``AgentSettings``)."""
        run_agent(self)
