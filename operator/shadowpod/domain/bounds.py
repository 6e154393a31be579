"""Bounds of the numbers that clients, owners and sessions control.

Seqs, epochs, turns and watermarks end up in 64-bit integer columns (SQLite's
INTEGER, PostgreSQL's bigint): a larger value must be refused where it comes in,
naming its field, not fail deep in a driver. Integers are strict: JSON ``true`` is
not the epoch 1, and ``"7"`` is not the seq 7.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, Strict

INT64_MAX: Final = 2**63 - 1

# A position in a session's journal: 0 is "before the first entry".
Seq = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
# A journal entry's own seq (entries start at 1), e.g. the inbound entry of a turn.
EntrySeq = Annotated[int, Strict(), Field(ge=1, le=INT64_MAX)]
# An owner generation: 0 is "no owner yet", owners write at 1 and up.
Epoch = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
OwnerEpoch = Annotated[int, Strict(), Field(ge=1, le=INT64_MAX)]

INT32_MAX: Final = 2**31 - 1

# A schema version (of a state document, of an agent's own state): a 32-bit column.
SchemaVersion = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]
