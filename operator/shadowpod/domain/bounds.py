"""Bounds of the numbers that clients, owners and sessions control.

Seqs, epochs, turns and watermarks end up in 64-bit integer columns (SQLite's
INTEGER, PostgreSQL's bigint): a larger value must be refused where it comes in,
naming its field, not fail deep in a driver. Integers are strict: JSON ``true`` is
not the epoch 1, and ``"7"`` is not the seq 7. An integer-valued number (``7.0``,
``7e0``) is the integer, as JSON Schema (the OpenAPI document's ``integer``) counts it;
``7.5`` is refused. Above 2^53 a number written with a fraction or an exponent is read
as the nearest double, as every JSON parser reads it: write integers as integers.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BeforeValidator, Field, Strict

INT64_MAX: Final = 2**63 - 1


def integral(value: object) -> object:
    """``7.0`` and ``7e0`` as the integer 7; anything else as it came (``true``,
    ``"7"`` and ``7.5`` are then refused by the strict integer check)."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


# A strict integer that JSON Schema would call one: the base of every bound below.
Integer = Annotated[int, BeforeValidator(integral), Strict()]
# JSON true or false only: "yes", 1 and "true" are not booleans (as JSON Schema says).
Boolean = Annotated[bool, Strict()]

# A position in a session's journal: 0 is "before the first entry".
Seq = Annotated[Integer, Field(ge=0, le=INT64_MAX)]
# A journal entry's own seq (entries start at 1), e.g. the inbound entry of a turn.
EntrySeq = Annotated[Integer, Field(ge=1, le=INT64_MAX)]
# An owner generation: 0 is "no owner yet", owners write at 1 and up.
Epoch = Annotated[Integer, Field(ge=0, le=INT64_MAX)]
OwnerEpoch = Annotated[Integer, Field(ge=1, le=INT64_MAX)]

INT32_MAX: Final = 2**31 - 1

# A schema version (of a state document, of an agent's own state): a 32-bit column.
SchemaVersion = Annotated[Integer, Field(ge=1, le=INT32_MAX)]
