"""LangGraph's values as JSON for the journal, item by item.

The journal holds JSON, and a delta is only as small as the items it appends: so a
list (a ``messages`` channel) is encoded item by item, each chat message as
LangChain's own dict form (``message_to_dict``, readable in the journal) less the
fields that hold their defaults (empty ``additional_kwargs``, ``tool_calls``, a
``None`` name...): LangChain fills them in again when it reads the message, and a
plain chat message is then half the bytes and a third of the objects — what every
snapshot encodes, every shadow loads and a new owner decodes. Anything else JSON
cannot hold (an ``Interrupt``, a ``Send``, a tuple, bytes, NaN) as
LangGraph's own serializer writes it, in base64. Objects whose keys start with ``$``
are wrapped, so no value of the graph is ever taken for one of these envelopes.

A ``Send`` (the packet a conditional edge sends a node: ``create_react_agent`` sends
each tool call with the graph's whole state) is encoded field by field, so that a list
inside it can be a reference: given ``lists``, the encoder asks it of every list, and
what it answers (``ShadowpodSaver``: ``{"$log": [channel, log, length], "+": [...]}``
for a list that starts with the items of one of its channel logs) stands for the
list; ``decode`` resolves such references with ``logs``. A value holding references
is wrapped in ``{"$refs": [[channel, log], ...], "$value": ...}``, so that the logs it
reads are known without walking it (retention keeps them).

Given ``objects``, the encoder asks it of every object that is not a scalar, and what
it answers stands for the object: ``ShadowpodSaver`` stores a pending
write whose value is an item just appended to a channel's log (a chat message, a
``Send``) as ``{"$item": [channel, log, index]}`` rather than that item again.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from functools import cache
from typing import Any, Final

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.types import Send
from pydantic import JsonValue

_SCALARS = (str, int, bool, type(None))
LOG_REF: Final = "$log"
ITEM_REF: Final = "$item"
REFS: Final = "$refs"
# A list to encode → what stands for it (a reference), or ``None``.
ListRefs = Callable[[list[Any]], dict[str, JsonValue] | None]
# An object (not a list) to encode → what stands for it, or ``None``.
ObjectRefs = Callable[[Any], JsonValue | None]
# ``[channel, log]`` → the items of that log (at least as many as a reference names).
LogReader = Callable[[list[Any]], list[Any]]


class ValueCodec:
    def __init__(self, serde: SerializerProtocol) -> None:
        self._serde = serde

    def encode(
        self, value: Any, lists: ListRefs | None = None, objects: ObjectRefs | None = None
    ) -> JsonValue:
        kind = type(value)
        if kind in _SCALARS:
            scalar: JsonValue = value
            return scalar
        if objects is not None and (ref := objects(value)) is not None:
            return ref
        if kind is float:
            return value if math.isfinite(value) else self._opaque(value)
        if kind is list:
            if lists is not None and (ref := lists(value)) is not None:
                return ref
            return [self.encode(item, lists, objects) for item in value]
        if kind is dict and all(type(key) is str for key in value):
            encoded = {key: self.encode(item, lists, objects) for key, item in value.items()}
            if any(key.startswith("$") for key in value):
                return {"$dict": encoded}
            return encoded
        if isinstance(value, BaseMessage):
            return {"$message": _compact(message_to_dict(value), type(value))}
        if kind is Send and value.timeout is None:
            return {"$send": [value.node, self.encode(value.arg, lists, objects)]}
        return self._opaque(value)

    def decode(self, data: Any, logs: LogReader | None = None) -> Any:
        if type(data) is list:
            return [self.decode(item, logs) for item in data]
        if type(data) is not dict:
            return data
        if len(data) == 1:
            ((key, inner),) = data.items()
            if key == "$message":
                return messages_from_dict([inner])[0]
            if key == "$serde":
                kind, text = inner
                return self._serde.loads_typed((kind, base64.b64decode(text)))
            if key == "$dict":
                return {k: self.decode(v, logs) for k, v in inner.items()}
            if key == "$send":
                node, arg = inner
                return Send(node, self.decode(arg, logs))
            if key == ITEM_REF:
                if logs is None:
                    raise ValueError("a reference to a channel log, decoded without the saver")
                return logs(inner)[int(inner[2])]
        if LOG_REF in data and len(data) <= 2:
            if logs is None:
                raise ValueError("a reference to a channel log, decoded without the saver")
            ref = data[LOG_REF]
            return [*logs(ref)[: int(ref[2])], *self.decode(data.get("+", []), logs)]
        if REFS in data and len(data) == 2:
            return self.decode(data["$value"], logs)
        return {key: self.decode(item, logs) for key, item in data.items()}

    def _opaque(self, value: Any) -> JsonValue:
        kind, data = self._serde.dumps_typed(value)
        return {"$serde": [kind, base64.b64encode(data).decode()]}


def _compact(form: dict[str, Any], kind: type[BaseMessage]) -> dict[str, Any]:
    """``message_to_dict``'s form without the fields equal to their defaults (an
    explicit default reads back as the default: ``messages_from_dict`` reads both)."""
    defaults = _defaults(kind)
    data = {
        name: item
        for name, item in form["data"].items()
        if name not in defaults or item != defaults[name]
    }
    return {"type": form["type"], "data": data}


@cache
def _defaults(kind: type[BaseMessage]) -> dict[str, Any]:
    """The defaults of a message class's optional fields (asked once per class: pydantic
    inspects a default factory's signature each time it is asked)."""
    return {
        name: field.get_default(call_default_factory=True, validated_data={})
        for name, field in kind.model_fields.items()
        if not field.is_required()
    }
