"""Runs of an OpenAI Agents SDK agent as Shadowpod turns.

- ``journaled_tool`` wraps a ``FunctionTool``: each call is a ``Turn.call`` keyed by
  the model's ``tool_call_id`` — intent before, result after — and before it runs,
  the call is written into the agent's state with what the session held (a save
  point, journaled with the intent). A tool is given that id (``ToolContext.
  tool_call_id``) to pass on as an idempotency key.
- ``run_agent`` runs ``Runner.run`` for a turn with a ``JournaledSession``. A turn
  redone by a new owner (the old one died mid-run) does not ask the model again for
  calls it already asked for — a real model would answer with new call ids, and the
  side effect would happen twice: it resumes from the save point, answering each
  saved call from the journal (a finished call by its result; one whose outcome is
  unknown by running it again if it is idempotent, else by an error saying it was
  not run again), and the run goes on from there.
- ``openai_agents_handler`` is ``@agent.on_message`` for a chat agent: each message a
  run, the reply its final output, with ``meta.version``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

import orjson
from agents import Agent as OpenAIAgent
from agents import FunctionTool, Runner, RunResult, Tool
from agents.items import TResponseInputItem
from agents.tool_context import ToolContext
from pydantic import JsonValue

from shadowpod.agent import ToolAbandoned, ToolFailed, Turn
from shadowpod.agent.values import written_by_ops
from shadowpod.integrations.openai_agents.session import JournaledSession

CALLS: Final = "openai_agents_calls"  # values[CALLS][session_id][call_id]: saved calls
written_by_ops(CALLS)
_running: ContextVar[tuple[Turn, JournaledSession] | None] = ContextVar(
    "shadowpod-openai-agents-run", default=None
)


def journaled_tool(tool: FunctionTool, *, idempotent: bool = False) -> FunctionTool:
    """``tool`` with each call journaled (see the module's docstring); ``idempotent``:
    safe to run again when its outcome is unknown after an owner change."""
    inner = tool.on_invoke_tool

    async def invoke(context: ToolContext[Any], arguments: str) -> Any:
        running = _running.get()
        if running is None:  # run outside Shadowpod: nothing to journal
            return await inner(context, arguments)
        turn, session = running
        call_id = context.tool_call_id
        _save_call(turn, session, call_id, tool.name, arguments)

        async def run() -> JsonValue:
            return _json(await inner(context, arguments))

        return await _journaled(turn, call_id, tool.name, arguments, run, idempotent)

    return dataclasses.replace(tool, on_invoke_tool=invoke)


def journaled_tools(
    tools: Collection[FunctionTool], *, idempotent: Collection[str] = ()
) -> list[Tool]:
    """Every tool journaled (for ``Agent(tools=...)``); ``idempotent`` names those safe
    to repeat."""
    return [journaled_tool(t, idempotent=t.name in idempotent) for t in tools]


async def _journaled(
    turn: Turn,
    call_id: str,
    name: str,
    arguments: str,
    run: Callable[[], Awaitable[JsonValue]],
    idempotent: bool,
) -> JsonValue:
    try:
        return await turn.call(
            f"{turn.seq}:{call_id}", name, {"arguments": arguments}, run, idempotent=idempotent
        )
    except ToolAbandoned as exc:
        return f"Not run again: {exc}. Tell the user it may or may not have happened."
    except ToolFailed as exc:
        return f"Error: {exc.error}"


def _save_call(turn: Turn, session: JournaledSession, call_id: str, name: str, args: str) -> None:
    """The call, in the agent's state, journaled with its intent (``save_state``): what a
    new owner redoing this turn resumes from."""
    root = turn.shared(CALLS)
    if not isinstance(root, dict):
        turn.set(CALLS, {})
        root = turn.shared(CALLS)
    if not isinstance(root.get(session.session_id), dict):
        turn.set([CALLS, session.session_id], {})
    call = {"turn": turn.seq, "name": name, "arguments": args}
    turn.set([CALLS, session.session_id, call_id], call)
    turn.save_state()


def _saved_calls(turn: Turn, session: JournaledSession) -> dict[str, Any]:
    """The calls saved by this turn (an earlier owner's run of it) for ``session``."""
    root = turn.shared(CALLS)
    saved = root.get(session.session_id) if isinstance(root, dict) else None
    if not isinstance(saved, dict):
        return {}
    return {cid: call for cid, call in saved.items() if call.get("turn") == turn.seq}


@contextmanager
def _bound(turn: Turn, session: JournaledSession) -> Iterator[None]:
    token = _running.set((turn, session))
    try:
        with session.bound(turn):
            yield
    finally:
        _running.reset(token)


async def run_agent(
    turn: Turn,
    agent: OpenAIAgent[Any],
    input: str | list[TResponseInputItem],
    session: JournaledSession,
    **runner: Any,
) -> RunResult:
    """``Runner.run(agent, input, session=session)`` for this turn, resumed from its
    save point when an earlier owner got as far as calling tools (``runner``: more of
    ``Runner.run``'s arguments)."""
    with _bound(turn, session):
        saved = _saved_calls(turn, session)
        if saved:
            input = await _resume(turn, session, input, saved)
        result = await Runner.run(agent, input, session=session, **runner)
        if _saved_calls(turn, session) or saved:
            turn.delete([CALLS, session.session_id])  # answered, in the session now
        return result


async def _resume(
    turn: Turn, session: JournaledSession, input: str | list[TResponseInputItem], saved: Any
) -> list[TResponseInputItem]:
    """The session as the old owner's run left it, with the calls it saved answered
    (from the journal): the run goes on from there, with no new input."""
    held = session.items()
    asked = _as_items(input)
    if held[-len(asked) :] != asked:
        await session.add_items(asked)  # saved by the old owner's run with the calls, or not
    answered = {item.get("call_id") for item in held if item.get("type") == "function_call_output"}
    items: list[Any] = []
    for call_id, call in saved.items():
        if call_id in answered:
            continue
        name, arguments = str(call["name"]), str(call["arguments"])

        async def never() -> JsonValue:
            raise RuntimeError("not run: the turn is being resumed")

        # Known to the journal: a result, or an intent alone (then never run again
        # unless idempotent; this wrapper cannot run it, it is not in this task).
        output = await _journaled(turn, call_id, name, arguments, never, False)
        items += [
            {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments},
            {"type": "function_call_output", "call_id": call_id, "output": _text(output)},
        ]
    await session.add_items(items)
    return []


def _as_items(input: str | list[TResponseInputItem]) -> list[Any]:
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    return orjson.loads(orjson.dumps(input))  # type: ignore[no-any-return]


def _json(value: Any) -> JsonValue:
    try:
        return orjson.loads(orjson.dumps(value))  # type: ignore[no-any-return]
    except TypeError:
        return str(value)


def _text(value: JsonValue) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def openai_agents_handler(
    agent: OpenAIAgent[Any],
    session: JournaledSession | None = None,
    *,
    meta: Callable[[Turn], dict[str, JsonValue]] | None = None,
    **runner: Any,
) -> Callable[[Turn], Awaitable[None]]:
    """``@agent.on_message`` for a chat agent: each message a run of ``agent`` on the
    journaled ``session``; the reply its final output, with ``meta.version`` (the
    Shadowpod agent's version) and whatever ``meta`` adds."""
    chat = session or JournaledSession()

    async def handle(turn: Turn) -> None:
        result = await run_agent(turn, agent, turn.content, chat, **runner)
        extra: dict[str, JsonValue] = {"version": turn.version}
        if meta is not None:
            extra.update(meta(turn))
        await turn.reply(str(result.final_output), **extra)

    return handle
