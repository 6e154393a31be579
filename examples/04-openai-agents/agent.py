"""An OpenAI Agents SDK agent on Shadowpod: an ``agents.Agent`` with a side-effecting
``send_email`` tool, its conversation in a journaled ``Session``, its tools through
Shadowpod's tool ledger.

    python examples/04-openai-agents/agent.py [--version 2]

The model is a deterministic fake (no network, no API key) that behaves as a real
one where it matters here: it names each tool call with a new random id, so asking
it again for the same thing asks for a different call. What it does with a message:

- ``email <to> <text>`` — calls ``send_email`` (takes ``$EMAIL_DELAY_S`` seconds; a
  side effect, never repeated), then answers ``done: <its result>``;
- anything else — ``you said: <text> (<n> messages so far)``, ``n`` counted in the
  session's own items.

The tool appends a line to ``$TOOL_LOG`` each time it runs; every reply carries
``meta.version``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from agents import Agent as OpenAIAgent
from agents import ModelResponse, RunConfig, Usage, function_tool
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from shadowpod.agent import Agent
from shadowpod.integrations.openai_agents import journaled_tools, openai_agents_handler


class ScriptedModel(Model):
    """A tool-calling model whose answer depends on the conversation, with random
    call ids (as a real model's)."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        last = items[-1]
        if last.get("type") == "function_call_output":
            return _message(f"done: {last['output']}")
        text = str(last.get("content", ""))
        if text.startswith("email "):
            _, to, body = [*text.split(" ", 2), ""][:3]
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call_{uuid.uuid4().hex}",
                name="send_email",
                arguments=json.dumps({"to": to, "text": body}),
                id=f"fc_{uuid.uuid4().hex}",
                status="completed",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        said = sum(1 for item in items if item.get("role") == "user")
        return _message(f"you said: {text} ({said} messages so far)")

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("this example's model does not stream")


def _message(text: str) -> ModelResponse:
    message = ResponseOutputMessage(
        id=f"msg_{uuid.uuid4().hex}",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
        role="assistant",
        status="completed",
        type="message",
    )
    return ModelResponse(output=[message], usage=Usage(), response_id=None)


def _ran(line: str) -> None:
    with Path(os.environ.get("TOOL_LOG", "tools.log")).open("a") as log:
        log.write(f"{line} pid={os.getpid()}\n")


@function_tool
async def send_email(to: str, text: str) -> str:
    """Send an email (a side effect: never to be repeated)."""
    _ran(f"email {to} {text}")
    await asyncio.sleep(float(os.environ.get("EMAIL_DELAY_S", "0")))
    return f"sent to {to}"


def make_agent(version: str) -> Agent:
    assistant: OpenAIAgent[Any] = OpenAIAgent(
        name="assistant",
        model=ScriptedModel(),
        tools=journaled_tools([send_email]),
    )
    agent = Agent("openai-agents-demo", version=version)
    agent.on_message(openai_agents_handler(assistant, run_config=RunConfig(tracing_disabled=True)))
    return agent


if __name__ == "__main__":
    version = sys.argv[sys.argv.index("--version") + 1] if "--version" in sys.argv else "1"
    make_agent(version).run()
