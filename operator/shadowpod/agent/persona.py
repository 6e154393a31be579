"""The agent's side of the persona check: answering a self-description probe in the
sandbox from the state it holds, and the re-anchor hook (``@agent.on_reanchor``).

A probe is a turn nobody sent: it runs through the same turn code as any (the same
``Turn`` API), from a copy of this instance's state, in the sandbox — its outputs
captured, never journaled; a tool call refused (there is no recording to answer it
from). It works in a shadow and in an owner alike: the source answers the same probe
for the baseline.
"""

from __future__ import annotations

from typing import Final

from pydantic import JsonValue

from shadowpod.agent.declaration import AgentDeclaration
from shadowpod.agent.identity import SessionIdentity
from shadowpod.agent.sandbox import answer_in_sandbox
from shadowpod.domain.state import PendingInbound, SessionState
from shadowpod.gates.answers import Answer
from shadowpod.gates.replay import GoldenTurn

PROBE_ID: Final = "persona-probe"


class NoReanchorHook(Exception):
    """The agent declares no ``@agent.on_reanchor``."""


async def probe(
    agent: AgentDeclaration, state: SessionState, message: str
) -> tuple[str, dict[str, JsonValue]]:
    """``agent``'s reply to ``message`` from ``state``, in the sandbox; its replies as
    one text, and the first one's meta."""
    inbound = PendingInbound(seq=state.watermark + 1, id=PROBE_ID, kind="message", content=message)
    answer = await answer_in_sandbox(agent, GoldenTurn(inbound, Answer()), state)
    replies = [o.payload for o in answer.outputs if o.kind == "message"]
    text = "\n".join(str(r.get("content", "")) for r in replies if r.get("role") == "assistant")
    meta = next((r.get("meta") for r in replies if isinstance(r.get("meta"), dict)), None)
    return text, dict(meta) if isinstance(meta, dict) else {}


async def reanchor(agent: AgentDeclaration, identity: SessionIdentity) -> None:
    if agent.reanchor_hook is None:
        raise NoReanchorHook(
            f"{agent.name} {agent.version} declares no re-anchor hook (@agent.on_reanchor)"
        )
    await agent.reanchor_hook(identity)
