"""``JournaledSession``: the OpenAI Agents SDK's ``Session`` (a conversation's items)
kept in the agent's state, under ``values["openai_agents"][session_id]``, so it moves
with the Shadowpod session.

Items are appended with ``append`` (journaled as the new items alone: a turn costs
what it adds, not the conversation); ``pop_item`` and ``clear_session`` are journaled
as the change they make. Inside an agent the items go to the turn being run
(``run_agent`` binds it); outside one, ``JournaledSession(values=...)`` works on a state
in memory (a test, or a state folded from a journal, read back).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

import orjson
from agents.items import TResponseInputItem
from agents.memory import SessionSettings
from agents.memory.session import SessionABC

from shadowpod.agent import DetachedState, StateWriter, Turn
from shadowpod.agent.values import written_by_ops

ROOT: Final = "openai_agents"  # the key of ``turn.values`` the sessions live under
written_by_ops(ROOT)


class NotInATurn(RuntimeError):
    def __init__(self) -> None:
        super().__init__(
            "JournaledSession keeps its items in a turn's state: run the agent with "
            "openai_agents_handler(...) or run_agent(turn, agent, input, session), or "
            "inside `with session.bound(turn):`; outside an agent, build it on a state in "
            "memory: JournaledSession(session_id, values={})"
        )


class JournaledSession(SessionABC):
    def __init__(
        self,
        session_id: str = "main",
        *,
        values: Mapping[str, Any] | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self._detached = None if values is None else DetachedState(values)
        self._turn: ContextVar[Turn | None] = ContextVar(
            f"shadowpod-openai-session-{id(self)}", default=None
        )

    @contextmanager
    def bound(self, turn: Turn) -> Iterator[Turn]:
        """Items added in this block go to ``turn``'s state."""
        token = self._turn.set(turn)
        try:
            yield turn
        finally:
            self._turn.reset(token)

    @property
    def turn(self) -> Turn | None:
        return self._turn.get()

    @property
    def values(self) -> dict[str, Any]:
        """Outside an agent process: the state this session works on, as changed."""
        if self._detached is None:
            raise RuntimeError("this session writes into turns: build it with values=...")
        return self._detached.values

    def _writer(self) -> StateWriter:
        turn = self._turn.get()
        if turn is not None:
            return turn
        if self._detached is not None:
            return self._detached
        raise NotInATurn

    def _stored(self) -> list[Any]:
        root = self._writer().shared(ROOT)
        items = root.get(self.session_id) if isinstance(root, dict) else None
        return items if isinstance(items, list) else []

    def items(self) -> list[TResponseInputItem]:
        """Every item, copied (the stored ones are never to be changed in place)."""
        return copy.deepcopy(self._stored())

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        stored = self._stored()
        if limit is not None:
            stored = stored[-limit:] if limit > 0 else []
        return copy.deepcopy(stored)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        writer = self._writer()
        root = writer.shared(ROOT)
        if not isinstance(root, dict):
            writer.set(ROOT, {})
        # As JSON (what the journal holds): what a model's pydantic output turns into.
        plain = orjson.loads(orjson.dumps(items, default=_plain))
        if not isinstance(writer.shared(ROOT).get(self.session_id), list):
            writer.set([ROOT, self.session_id], plain)
            return
        writer.append([ROOT, self.session_id], *plain)

    async def pop_item(self) -> TResponseInputItem | None:
        stored = self._stored()
        if not stored:
            return None
        last = copy.deepcopy(stored[-1])
        self._writer().delete([ROOT, self.session_id, len(stored) - 1])
        return last  # type: ignore[no-any-return]

    async def clear_session(self) -> None:
        if self._stored():
            self._writer().set([ROOT, self.session_id], [])


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_unset=True)
    raise TypeError(f"a session item holds {type(value).__name__}, which is not JSON")
