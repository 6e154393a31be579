"""Deltas of the agent's own state: what changed, in O(change) bytes.

An agent that keeps its conversation as one growing value (``values["messages"] =
[*old, new]``, LangGraph's layout) would otherwise journal that whole value every
turn, and a long session's writes would grow with its length: quadratic in total.
``diff`` turns the state a turn leaves into ``StateOp`` deltas — a list that grew
becomes an ``append`` of its new items, a changed key of an object a ``set`` at its
path, a removed key a ``delete`` — and ``apply_ops`` folds them.

Folding is copy-on-write: the containers of a state's values are shared between
copies of the state (a snapshot being encoded, the state a turn reads), so an op
copies each container on its path before changing it — unless this fold already
made that copy itself (``owned``), so folding *n* appends to one list costs O(n),
not O(n²). ``apply_ops`` is total: an op that does not fit the values (a path that
is not there, an append to something that is not a list) is skipped and reported,
and the same journal always folds to the same values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import is_not
from typing import Any, Final

from shadowpod.domain.payloads import MAX_STATE_OPS, StateOp, StateOpKind

# The containers a fold copied itself and may change in place, by id. The objects are
# held too, so an id is never reused by another object while it is in here.
Owned = dict[int, object]

# A list of equal length whose items changed in at most this many places is written
# as sets at those indexes; more, and the list is set whole.
_MAX_ITEM_SETS: Final = 8


def apply_ops(values: dict[str, Any], ops: Sequence[StateOp], owned: Owned) -> str | None:
    """Apply ``ops`` in order to ``values`` (changed in place: the caller's own copy).

    Returns what was wrong with the first op that could not apply, if any (that op,
    and any other that cannot, is skipped; the others apply).
    """
    error: str | None = None
    for index, op in enumerate(ops):
        problem = _apply_one(values, op, owned)
        if problem is not None and error is None:
            error = f"ops.{index}: {problem}"
    return error


def _apply_one(values: dict[str, Any], op: StateOp, owned: Owned) -> str | None:
    container: Any = values
    *parents, last = op.path
    for depth, key in enumerate(parents):
        child = _get(container, key)
        if not isinstance(child, dict | list):
            where = _render(op.path[: depth + 1])
            return f"{where} is not an object or a list" if child is not _MISSING else f"no {where}"
        if id(child) not in owned:
            child = dict(child) if isinstance(child, dict) else list(child)
            owned[id(child)] = child
            container[key] = child
        container = child
    if isinstance(container, dict) and not isinstance(last, str):
        return f"{_render(op.path)}: an object's keys are strings"
    if isinstance(container, list) and not isinstance(last, int):
        return f"{_render(op.path)}: a list's indexes are integers"
    if op.op is StateOpKind.SET:
        if isinstance(container, list) and last >= len(container):  # type: ignore[operator]
            return f"no {_render(op.path)} to set (the list has {len(container)} items)"
        container[last] = op.value
    elif op.op is StateOpKind.DELETE:
        if isinstance(container, dict):
            container.pop(last, None)
        elif last < len(container):  # type: ignore[operator]
            del container[last]
    else:
        target = _get(container, last)
        if target is _MISSING and isinstance(container, dict):
            target = []
        elif not isinstance(target, list):
            return f"{_render(op.path)} is not a list to append to"
        if id(target) not in owned:
            target = list(target)
            owned[id(target)] = target
            container[last] = target
        target.extend(op.items)
    return None


_MISSING: Final = object()


def _get(container: Any, key: str | int) -> Any:
    if isinstance(container, dict):
        return container.get(key, _MISSING)
    if isinstance(key, int) and key < len(container):
        return container[key]
    return _MISSING


def _render(path: Sequence[str | int]) -> str:
    return "values" + "".join(f"[{key!r}]" for key in path)


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[StateOp] | None:
    """The ops that turn ``before`` into ``after``; ``None`` when there would be more
    than an entry may carry (the caller then writes the values whole)."""
    ops: list[StateOp] = []
    _diff_object([], before, after, ops)
    return ops if len(ops) <= MAX_STATE_OPS else None


def _diff_object(
    path: list[str | int], before: Mapping[str, Any], after: Mapping[str, Any], ops: list[StateOp]
) -> None:
    for key in before:
        if key not in after:
            ops.append(StateOp(op=StateOpKind.DELETE, path=[*path, key]))
    for key, new in after.items():
        old = before.get(key, _MISSING)
        if old is _MISSING:
            ops.append(StateOp(op=StateOpKind.SET, path=[*path, key], value=new))
        else:
            _diff_value([*path, key], old, new, ops)


def _diff_value(path: list[str | int], old: Any, new: Any, ops: list[StateOp]) -> None:
    if old is new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        _diff_object(path, old, new, ops)
    elif isinstance(old, list) and isinstance(new, list):
        _diff_list(path, old, new, ops)
    elif not _same(old, new):
        ops.append(StateOp(op=StateOpKind.SET, path=path, value=new))


def _diff_list(path: list[str | int], old: list[Any], new: list[Any], ops: list[StateOp]) -> None:
    n = len(old)
    if len(new) > n and _same_items(old, new[:n]):
        ops.append(StateOp(op=StateOpKind.APPEND, path=path, items=new[n:]))
        return
    if len(new) == n:
        changed = [i for i in range(n) if not _same(old[i], new[i])]
        if len(changed) <= _MAX_ITEM_SETS:
            for i in changed:
                _diff_value([*path, i], old[i], new[i], ops)
            return
    ops.append(StateOp(op=StateOpKind.SET, path=path, value=new))


def _same_items(old: list[Any], new: list[Any]) -> bool:
    # A turn's list mostly shares the items it had: compared by identity at C speed.
    # Python's ``==`` alone would take ``1`` for ``True`` and ``1.0`` (not so in JSON).
    return not any(map(is_not, old, new)) or (old == new and all(map(_same, old, new)))


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON: of one type all the way down (``True`` is not ``1``)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return len(a) == len(b) and all(k in b and _same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)
