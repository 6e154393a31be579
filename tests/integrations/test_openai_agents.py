"""The OpenAI Agents SDK on Shadowpod, on a real SQLite journal store with the SDK's
own ``Turn`` (an owner in process): the session's items are journaled and read back
by a new owner; an owner that dies after a tool's side effect is followed by one that
neither calls the tool again nor asks the model again for the call (a real model
would answer with new call ids, and the email would go twice)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent as OpenAIAgent
from agents import ModelResponse, RunConfig, Usage, function_tool
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from shadowpod.agent import Turn
from shadowpod.bench.inprocess import EPOCH, InProcessOwner
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.reducer import StateFolder, fold
from shadowpod.domain.state import SessionState
from shadowpod.integrations.openai_agents import (
    JournaledSession,
    journaled_tools,
    openai_agents_handler,
)
from shadowpod.journal.sqlite.store import SQLiteJournalStore

SESSION = "openai-agents"


class ChattyModel(Model):
    """A tool-calling model that, like a real one, names each call with a new random
    id: asked twice for the same thing, it asks for two different calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kw: Any
    ) -> Any:
        self.calls += 1
        items = [input] if isinstance(input, str) else list(input)
        last = items[-1] if items else {}
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            return _said(f"done: {last['output']}")
        text = last.get("content") if isinstance(last, dict) else str(last)
        if isinstance(text, str) and text.startswith("email "):
            _, to, body = text.split(" ", 2)
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call_{uuid.uuid4().hex}",
                name="send_email",
                arguments=f'{{"to": "{to}", "text": "{body}"}}',
                id=f"fc_{uuid.uuid4().hex}",
                status="completed",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        users = sum(1 for i in items if isinstance(i, dict) and i.get("role") == "user")
        return _said(f"you said: {text} ({users} messages so far)")

    def stream_response(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError


def _said(text: str) -> ModelResponse:
    message = ResponseOutputMessage(
        id=f"msg_{uuid.uuid4().hex}",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
        role="assistant",
        status="completed",
        type="message",
    )
    return ModelResponse(output=[message], usage=Usage(), response_id=None)


class Outbox:
    """Where the email tool sends: a side effect, counted. ``hold`` keeps it from
    returning (the owner dies there)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.sending = asyncio.Event()
        self.hold = asyncio.Event()
        self.hold.set()

    def tool(self) -> Any:
        @function_tool
        async def send_email(to: str, text: str) -> str:
            """Send an email (a side effect: never to be repeated)."""
            self.sent.append(f"{to}: {text}")
            self.sending.set()
            await self.hold.wait()
            return f"sent to {to}"

        return send_email


def handler_of(model: ChattyModel, outbox: Outbox) -> Any:
    return openai_agents_handler(
        assistant(model, outbox), run_config=RunConfig(tracing_disabled=True)
    )


def assistant(model: ChattyModel, outbox: Outbox) -> OpenAIAgent[Any]:
    tools = journaled_tools([outbox.tool()])
    return OpenAIAgent(name="assistant", model=model, tools=tools)


@pytest.fixture
async def owner(tmp_path: Path) -> AsyncIterator[InProcessOwner]:
    store = SQLiteJournalStore(tmp_path / "journal.db")
    await store.open()
    try:
        await store.create_session(SESSION)
        await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="test"))
        yield InProcessOwner(store, SESSION)
    finally:
        await store.close()


async def folded(owner: InProcessOwner) -> SessionState:
    entries: list[Any] = []
    while page := await owner.store.read(SESSION, after=entries[-1].seq if entries else 0):
        entries += page
    return fold(SessionState(), entries)


async def reply_to(owner: InProcessOwner, seq: int) -> str:
    (reply,) = [
        e
        for e in await owner.store.read(SESSION, after=seq)
        if e.kind == EntryKind.MESSAGE and e.payload.get("turn") == seq
    ]
    return str(reply.payload["content"])


async def say(owner: InProcessOwner, handler: Any, content: str) -> str:
    seq, turn = await owner.open_turn(content)
    await handler(turn)
    await owner.close_turn(seq, turn)
    return await reply_to(owner, seq)


async def test_the_conversation_moves_with_the_session(owner: InProcessOwner) -> None:
    handler = handler_of(ChattyModel(), Outbox())
    assert await say(owner, handler, "hello") == "you said: hello (1 messages so far)"
    assert await say(owner, handler, "again") == "you said: again (2 messages so far)"

    moved = InProcessOwner(owner.store, SESSION)
    moved.folder = StateFolder(await folded(owner))
    handler = handler_of(ChattyModel(), Outbox())
    assert await say(moved, handler, "moved?") == "you said: moved? (3 messages so far)"
    # Read back outside any agent, from the journal alone.
    read = JournaledSession(values=(await folded(moved)).agent.values)
    roles = [item.get("role") for item in await read.get_items()]
    assert roles == ["user", "assistant"] * 3
    assert len(await read.get_items(limit=2)) == 2


async def test_a_new_owner_neither_sends_the_email_again_nor_asks_the_model_again(
    owner: InProcessOwner,
) -> None:
    model, outbox = ChattyModel(), Outbox()
    handler = handler_of(model, outbox)
    assert await say(owner, handler, "hello") == "you said: hello (1 messages so far)"
    seq, turn = await owner.open_turn("email bob hi")
    outbox.hold.clear()  # the email goes, then the owner dies before its result
    dying = asyncio.create_task(handler(turn))
    await asyncio.wait_for(outbox.sending.wait(), timeout=30)
    dying.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dying
    asked_before = model.calls

    # A new owner at the next epoch redoes the turn from the journal alone.
    state = await folded(owner)
    assert seq in state.pending
    moved = InProcessOwner(owner.store, SESSION)
    moved.folder = StateFolder(state)
    redo = Turn(
        tools={},
        state_schema=1,
        state=state,
        inbound=state.pending[seq],
        values=dict(state.agent.values),
        epoch=EPOCH,
        instance="new-owner",
        append=lambda entries: moved.append(list(entries), EPOCH),
        processes=None,  # type: ignore[arg-type]
    )
    model2, outbox2 = ChattyModel(), Outbox()
    await handler_of(model2, outbox2)(redo)
    await moved.close_turn(seq, redo)

    assert outbox.sent == ["bob: hi"] and outbox2.sent == []
    assert (await reply_to(moved, seq)).startswith("done: Not run again: ")
    # One model call: the one that reads the call's outcome, never one asking again.
    assert model2.calls == 1 and asked_before == 2
    # The session's history is whole: the call with its output, once.
    items = await JournaledSession(values=(await folded(moved)).agent.values).get_items()
    kinds = [item.get("type") or item.get("role") for item in items]
    assert kinds == [
        "user",
        "message",
        "user",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert await say(moved, handler_of(model2, outbox2), "ok?") == (
        "you said: ok? (3 messages so far)"
    )
