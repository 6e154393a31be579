"""The agent runtime SDK: make any Python agent migratable.

from shadowpod.agent import Agent, Turn

agent = Agent("support-bot", version="1")

@agent.on_message
async def answer(turn: Turn) -> None:
    await turn.reply("hello")

agent.run()
"""

from shadowpod.agent.app import Agent
from shadowpod.agent.identity import SessionIdentity
from shadowpod.agent.turn import OwnerContext, ToolAbandoned, ToolFailed, Turn
from shadowpod.agent.values import DetachedState, StateWriter

__all__ = [
    "Agent",
    "DetachedState",
    "OwnerContext",
    "SessionIdentity",
    "StateWriter",
    "ToolAbandoned",
    "ToolFailed",
    "Turn",
]
