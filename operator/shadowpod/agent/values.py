"""The agent's own state as code outside a handler writes it: ``StateWriter``, which a
``Turn`` is, and ``DetachedState``, the same writes on an agent state held in
memory, outside any agent process.

A framework's integration (a LangGraph checkpointer, an OpenAI Agents SDK session)
keeps its data under one key of the values and changes it only with ``append`` /
``set`` / ``delete``: each journaled as it is, O(change) bytes. Its reads go through
``shared``, which hands out what the state holds without a copy. Inside an agent the
writer is the turn; outside one — a test, LangGraph's checkpointer conformance suite,
an admin reading or editing a state folded from a journal — it is a
``DetachedState``: the same copy-on-write folding (``shadowpod.domain.deltas``), so
what it holds afterwards is what the journal would fold to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import orjson

from shadowpod.domain.deltas import Owned, apply_ops
from shadowpod.domain.payloads import StateKey, StateOp, StateOpKind


class StateWriter(Protocol):
    def shared(self, key: str) -> Any:
        """The value at ``key`` as the state holds it, not copied: never to be changed
        in place (change it with ``append`` / ``set`` / ``delete``)."""
        ...

    def append(self, path: str | Sequence[StateKey], *items: object) -> None: ...

    def set(self, path: str | Sequence[StateKey], value: object) -> None: ...

    def delete(self, path: str | Sequence[StateKey]) -> None: ...


class DetachedState:
    """An agent state in memory, outside any agent process, written as a turn writes
    it. ``values`` is never changed in place: the containers on a path are copied once
    (so a state folded from a journal, given here, stays as it was)."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self.values: dict[str, Any] = dict(values or {})
        self._owned: Owned = {}

    def shared(self, key: str) -> Any:
        return self.values.get(key)

    def append(self, path: str | Sequence[StateKey], *items: object) -> None:
        self._change(StateOp(op=StateOpKind.APPEND, path=state_path(path), items=list(items)))

    def set(self, path: str | Sequence[StateKey], value: object) -> None:
        self._change(StateOp(op=StateOpKind.SET, path=state_path(path), value=value))

    def delete(self, path: str | Sequence[StateKey]) -> None:
        self._change(StateOp(op=StateOpKind.DELETE, path=state_path(path)))

    def _change(self, op: StateOp) -> None:
        error = apply_ops(self.values, [op], self._owned)
        if error is not None:
            raise ValueError(f"cannot {op.op.value} {error.partition(': ')[2]}")


# Keys of the values that a framework's integration changes only with ``append`` / ``set``
# / ``delete`` and whose in-place changes it journals itself (the LangGraph saver's
# ``settle``): a turn does not compare them by content (``written_by_ops``).
_WRITTEN_BY_OPS: Final[set[str]] = set()


def written_by_ops(key: str) -> None:
    """Declare ``key`` of the values as written by ops alone, its in-place changes
    journaled by its writer: a turn then does not serialize it to compare it."""
    _WRITTEN_BY_OPS.add(key)


def contents(values: Mapping[str, Any]) -> dict[str, bytes]:
    """What each key of ``values`` holds, as JSON bytes, to tell later whether its value
    was changed in place (``changed_in_place``); keys written by ops alone and values
    that are not JSON are left out."""
    found: dict[str, bytes] = {}
    for key, value in values.items():
        if key in _WRITTEN_BY_OPS:
            continue
        try:
            found[key] = orjson.dumps(value)
        except TypeError:
            continue
    return found


def changed_in_place(before: Mapping[str, Any], held: Mapping[str, bytes]) -> set[str]:
    """The keys whose value in ``before`` (the very objects) no longer holds what it
    did when ``held`` was taken: changed in place."""
    changed = set()
    for key, was in held.items():
        if key in before:
            try:
                now = orjson.dumps(before[key])
            except TypeError:
                now = b""
            if now != was:
                changed.add(key)
    return changed


def state_path(path: str | Sequence[StateKey]) -> list[StateKey]:
    return [path] if isinstance(path, str) else list(path)
