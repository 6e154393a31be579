"""Checkpoint headers written as a change from their parent's.

A checkpoint's header holds every channel's version, what every node has seen
(``versions_seen``) and what each channel version holds when small (``held``):
written whole, that is ~700 bytes a checkpoint, five checkpoints a tool-calling turn
of ``create_react_agent`` — most of it the same as the parent's. So a header whose
parent is stored is written as a change from it (``DELTA``: only the versions, seen
versions and held values that changed, and the keys that went), and a reader builds
the whole header back by walking up the parents to one written whole (``resolve``).

The walk is bounded: a chain is at most ``FULL_EVERY`` headers (the next one is
written whole), and a header whose parent is not stored (a checkpoint put from
elsewhere, or after its parent was pruned) is written whole. Pruning (``retention``)
writes a kept header whole when its parent goes: the chains of the headers after it
end there, so no header reads one that is gone. A header written whole — every
header written before 27 Nov — reads as it always did.

A checkpoint's pending writes are kept under its header (``WRITES``), so that
pruning it is one delete; those written before 27 Nov, in the namespace's
``writes`` map, read as before (``writes_of``).

A change is, for a flat map, ``[changed]`` or ``[changed, removed keys]`` (``changed``
encoded by the saver's codec, as a whole header's maps are), or for channel versions
that all changed to one (as a step's do) ``[[channels], version]``; for
``versions_seen``, ``[{node: change of its map}]`` or ``[{...}, removed nodes]``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, Final, Protocol

DELTA: Final = "delta"  # a header written as a change: ``{"versions", "seen", "held"}``
HELD: Final = "held"
WRITES: Final = "writes"  # a header's pending writes, by ``task:index``
FULL_EVERY: Final = 16  # at most this many headers read to build one
Decode = Callable[[Any], Any]
Encode = Callable[[Any], Any]
BUCKETS: Final = 64


class Codec(Protocol):
    """How a header's maps are stored (``codec.ValueCodec``)."""

    def encode(self, value: Any) -> Any: ...

    def decode(self, data: Any) -> Any: ...


def bucket(key: str) -> str:
    """The bucket of a checkpoint id or a channel version (stable across processes)."""
    return str(zlib.crc32(key.encode()) % BUCKETS)


class Resolved:
    """A header's maps in full: channel versions and ``versions_seen`` decoded,
    ``held`` as stored; ``depth``: the changes read to build them (0: whole)."""

    __slots__ = ("depth", "held", "seen", "versions")

    def __init__(
        self,
        versions: dict[str, Any],
        seen: dict[str, dict[str, Any]],
        held: dict[str, Any],
        depth: int,
    ) -> None:
        self.versions = versions
        self.seen = seen
        self.held = held
        self.depth = depth


def stored_header(data: dict[str, Any], checkpoint_id: str | None) -> dict[str, Any] | None:
    if checkpoint_id is None:
        return None
    found = data["checkpoints"].get(bucket(checkpoint_id), {}).get(checkpoint_id)
    return found if isinstance(found, dict) else None


def writes_of(data: dict[str, Any], checkpoint_id: str) -> dict[str, Any]:
    """A checkpoint's pending writes by ``task:index``: under its header (``WRITES``,
    deleted with it), or, as written before 27 Nov or for a checkpoint not stored,
    in the namespace's ``writes`` map."""
    header = stored_header(data, checkpoint_id)
    nested = {} if header is None else header.get(WRITES, {})
    apart = data["writes"].get(bucket(checkpoint_id), {}).get(checkpoint_id)
    return nested if not apart else {**apart, **nested}


def resolve(
    data: dict[str, Any],
    checkpoint_id: str,
    decode: Decode,
    memo: dict[str, Resolved] | None = None,
) -> Resolved | None:
    """The header of ``checkpoint_id`` in full, from its chain; ``None``: no such
    checkpoint, or its chain is broken (a parent it reads is gone). ``memo``: headers
    resolved before, by id (read, and added to): resolving every header of a thread
    (pruning) then reads each change once."""
    chain: list[tuple[str, dict[str, Any]]] = []
    cid: str | None = checkpoint_id
    header = stored_header(data, cid)
    base = None
    while header is not None:
        if memo is not None and cid in memo:
            base = memo[cid]
            break
        if DELTA not in header:
            base = Resolved(
                dict(decode(header["versions"])),
                {node: dict(seen) for node, seen in decode(header["seen"]).items()},
                dict(header.get(HELD, {})),
                0,
            )
            if memo is not None:
                memo[str(cid)] = base
            break
        chain.append((str(cid), header[DELTA]))
        if len(chain) > FULL_EVERY:  # never written so: a cycle, or not ours
            return None
        cid = header["parent"]
        header = stored_header(data, cid)
    if base is None:
        return None
    for at, change in reversed(chain):
        versions, held = dict(base.versions), dict(base.held)
        _apply_flat(versions, change["versions"], decode)
        _apply_flat(held, change[HELD], None)
        seen = dict(base.seen)
        for node, node_change in change["seen"][0].items():
            seen[node] = dict(seen.get(node, {}))
            _apply_flat(seen[node], node_change, decode)
        for node in change["seen"][1] if len(change["seen"]) > 1 else ():
            seen.pop(node, None)
        base = Resolved(versions, seen, held, base.depth + 1)
        if memo is not None:
            memo[at] = base
    return base


def as_change(parent: Resolved, header: Resolved, encode: Encode) -> dict[str, Any] | None:
    """``DELTA`` of ``header``'s maps from its ``parent``'s; ``None``: write it whole
    (the chain is ``FULL_EVERY`` long)."""
    if parent.depth + 1 >= FULL_EVERY:
        return None
    seen_changed: dict[str, Any] = {}
    for node, node_seen in header.seen.items():
        before = parent.seen.get(node)
        if before is None or before != node_seen:
            seen_changed[node] = _flat_change(before or {}, node_seen, encode)
    seen_removed = [node for node in parent.seen if node not in header.seen]
    return {
        "versions": _versions_change(parent.versions, header.versions, encode),
        "seen": [seen_changed, seen_removed] if seen_removed else [seen_changed],
        HELD: _flat_change(parent.held, header.held, None),
    }


def whole(resolved: Resolved, encode: Encode) -> dict[str, Any]:
    """A header's maps written whole."""
    return {
        "versions": encode(resolved.versions),
        "seen": encode(resolved.seen),
        HELD: resolved.held,
    }


def rewritten_whole(stored: dict[str, Any], resolved: Resolved, encode: Encode) -> dict[str, Any]:
    """A header written as a change, written whole instead (its parent to be pruned)."""
    header = {key: value for key, value in stored.items() if key != DELTA}
    header.update(whole(resolved, encode))
    return header


def _flat_change(before: dict[str, Any], after: dict[str, Any], encode: Encode | None) -> list[Any]:
    changed = {
        key: value for key, value in after.items() if key not in before or before[key] != value
    }
    removed = [key for key in before if key not in after]
    encoded = changed if encode is None else encode(changed)
    return [encoded, removed] if removed else [encoded]


def _versions_change(before: dict[str, Any], after: dict[str, Any], encode: Encode) -> list[Any]:
    """``_flat_change`` of the channel versions; where they all changed to one version
    (a step's new versions are one), ``[[channels], version]``: the version once."""
    changed = [key for key, value in after.items() if key not in before or before[key] != value]
    if len(changed) > 1 and all(key in after for key in before):
        versions = {after[key] for key in changed if type(after[key]) is str}
        if len(versions) == 1 and all(type(after[key]) is str for key in changed):
            return [changed, versions.pop()]
    return _flat_change(before, after, encode)


def _apply_flat(target: dict[str, Any], change: list[Any], decode: Decode | None) -> None:
    if type(change[0]) is list:  # ``[[keys], value]``: ``_versions_change``
        target.update(dict.fromkeys(change[0], change[1]))
        return
    target.update(change[0] if decode is None else decode(change[0]))
    for key in change[1] if len(change) > 1 else ():
        target.pop(key, None)
