"""Owner appends cut to fit the gateway's limits.

The gateway refuses a body larger than its ``max_body_bytes`` (1 MiB by default) and
more than ``max_entries_per_append`` entries (1000) in one append. An owner write over
either can never succeed, however often it is retried. So an owner's append goes out
as appends under both, in order — the same entries with the same ids, a turn's ack in
the last — and a ``state`` entry too large for an append on its own (a long
conversation kept as one value; the state a new owner migrates as it takes over) is
journaled in parts that the reducer puts back together (``StatePart``). Any other
entry that large cannot be journaled: that is ``WriteRefused``, an error that
surfaces, never a retry.

The limits start from settings (the gateway's defaults) and are learnt from the
gateway: a 413 names the limit it enforces.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import orjson

from shadowpod.client.gateway import GatewayError
from shadowpod.domain.entries import ENTRY_ID_MAX, NewEntry
from shadowpod.domain.payloads import MAX_STATE_PARTS, EntryKind, StatePart, StatePayload

# What an append's body holds besides its entries (``{"op": "append", "id": 12,
# "entries": [...]}`` on the channel, ``{"epoch": 3, "entries": [...], "after": null}``
# over HTTP), with room to spare.
ENVELOPE_BYTES: Final = 256
# The gateway accepts no smaller body limit: below it nothing more can be learnt.
SMALLEST_BODY: Final = 1024
_GROUP_MAX: Final = ENTRY_ID_MAX - 8  # room for ":<index>" in the parts' ids
_LIMIT_IN_MESSAGE: Final = re.compile(r"(\d+) bytes|at most (\d+)")


class WriteRefused(Exception):
    """An owner write that can never succeed: the gateway refused it for good (a 4xx
    other than ``Fenced``), or it cannot be cut to fit the gateway's limits."""


def fitting_id(entry_id: str) -> str:
    """``entry_id``, or when it is longer than the journal allows, its start and a
    digest of the whole: a derived id stays derived (a retried write still finds the
    first) and always fits. Derived ids embed names others choose (an instance's,
    a tool call's), which can be long."""
    if len(entry_id) <= ENTRY_ID_MAX:
        return entry_id
    digest = hashlib.sha256(entry_id.encode()).hexdigest()[:40]
    return f"{entry_id[: ENTRY_ID_MAX - len(digest) - 1]}~{digest}"


def permanent(error: GatewayError) -> bool:
    """Whether the same request can never succeed: a 4xx other than ``Fenced`` (which
    means another owner) and the two a client is meant to retry (408, 429)."""
    return 400 <= error.status < 500 and error.reason != "Fenced" and error.status not in (408, 429)


@dataclass
class AppendLimits:
    max_bytes: int
    max_entries: int

    @property
    def entries_budget(self) -> int:
        """Bytes of entries one append may carry."""
        return self.max_bytes - ENVELOPE_BYTES

    def learn(self, error: GatewayError) -> bool:
        """Narrow the limits after a 413; ``False`` when nothing could be learnt (the
        write cannot be cut any smaller)."""
        named = _named_limit(error)
        if error.reason == "TooManyEntries":
            smaller = named if named is not None and named < self.max_entries else None
            if smaller is None and self.max_entries > 1:
                smaller = self.max_entries // 2
            if smaller is None or smaller < 1:
                return False
            self.max_entries = smaller
            return True
        if named is not None and named < self.max_bytes:
            self.max_bytes = max(named, SMALLEST_BODY)
            return True
        # Refused although under the limit it names (or names none): our estimate of
        # the envelope was short. Halve, down to the smallest limit a gateway has.
        if self.max_bytes <= SMALLEST_BODY:
            return False
        self.max_bytes = max(self.max_bytes // 2, SMALLEST_BODY)
        return True


def _named_limit(error: GatewayError) -> int | None:
    for item in error.errors:
        if isinstance(item, dict) and isinstance(item.get("limit"), int):
            return int(item["limit"])
    found = _LIMIT_IN_MESSAGE.search(error.message)
    if found is None:
        return None
    return int(found.group(1) or found.group(2))


@dataclass(frozen=True)
class Batch:
    """One append: ``entries``, the first of which journals the owner's entry
    ``first`` (or a part of it)."""

    entries: list[NewEntry]
    first: int


def plan_appends(entries: Sequence[NewEntry], limits: AppendLimits) -> list[Batch]:
    """``entries`` as appends under ``limits``, in order; ``WriteRefused`` for an
    entry that cannot be journaled under them."""
    budget = limits.entries_budget
    sizes = [_size(entry) for entry in entries]
    if sum(sizes) <= budget and len(entries) <= limits.max_entries:
        return [Batch(list(entries), 0)]
    batches: list[Batch] = []
    batch: list[NewEntry] = []
    used = 0
    first = 0
    for index, (entry, size) in enumerate(zip(entries, sizes, strict=True)):
        units = [(entry, size)] if size <= budget else _parts(entry, size, budget)
        for unit, unit_size in units:
            if batch and (used + unit_size > budget or len(batch) >= limits.max_entries):
                batches.append(Batch(batch, first))
                batch, used, first = [], 0, index
            batch.append(unit)
            used += unit_size
    if batch:
        batches.append(Batch(batch, first))
    return batches


def state_parts(entry: NewEntry, part_bytes: int) -> list[NewEntry]:
    """``entry`` (a ``state`` entry) as parts of at most ``part_bytes`` of data each.

    The parts' ids derive from the entry's id, its content and the part size: a
    retried append journals them once, and the same turn redone with other values, or
    cut another size, starts a group of its own instead of mixing with the first.
    """
    whole = orjson.dumps(entry.payload)
    data = base64.b64encode(whole).decode("ascii")
    digest = hashlib.sha256(whole).hexdigest()[:16]
    group = f"{entry.id}:{digest}:{part_bytes}"
    if len(group) > _GROUP_MAX:
        group = f"{hashlib.sha256(entry.id.encode()).hexdigest()[:40]}:{digest}:{part_bytes}"
    chunks = [data[at : at + part_bytes] for at in range(0, len(data), part_bytes)]
    turn = entry.payload.get("turn")
    of_turn = {"turn": turn} if isinstance(turn, int) else {}
    return [
        NewEntry.of(
            StatePayload(
                part=StatePart(group=group, index=index, count=len(chunks), data=chunk),
                **of_turn,
            ),
            id=f"{group}:{index}",
        )
        for index, chunk in enumerate(chunks)
    ]


def _parts(entry: NewEntry, size: int, budget: int) -> list[tuple[NewEntry, int]]:
    if entry.kind != EntryKind.STATE:
        turn = entry.payload.get("turn")
        of_turn = f" of turn {turn}" if turn is not None else ""
        raise WriteRefused(
            f"the {entry.kind} entry {entry.id!r}{of_turn} is {size} bytes as JSON; the "
            f"gateway takes at most {budget + ENVELOPE_BYTES} bytes per append. Keep large "
            "data in the agent's state (turn.values), which is journaled in parts, or "
            "raise the gateway's --max-body-bytes"
        )
    # A part's own fields (its id, group, index, count) take far less than this.
    part_bytes = budget - 2 * ENTRY_ID_MAX - 128
    if part_bytes < 64:
        raise WriteRefused(f"the gateway's body limit ({budget + ENVELOPE_BYTES}) is too small")
    parts = state_parts(entry, part_bytes)
    if len(parts) > MAX_STATE_PARTS:
        raise WriteRefused(f"the state entry {entry.id!r} would take {len(parts)} parts")
    return [(part, _size(part)) for part in parts]


def _size(entry: NewEntry) -> int:
    """The bytes ``entry`` takes in an append's body (with its separating comma)."""
    return len(orjson.dumps({"id": entry.id, "kind": entry.kind, "payload": entry.payload})) + 1
