"""LangGraph's values as JSON for the journal, item by item.

The journal holds JSON, and a delta is only as small as the items it appends: so a
list (a ``messages`` channel) is encoded item by item, each chat message as
LangChain's own dict form (``message_to_dict``, readable in the journal), anything
else JSON cannot hold (an ``Interrupt``, a ``Send``, a tuple, bytes, NaN) as
LangGraph's own serializer writes it, in base64. Objects whose keys start with ``$``
are wrapped, so no value of the graph is ever taken for one of these envelopes.
"""

from __future__ import annotations

import base64
import math
from typing import Any

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langgraph.checkpoint.serde.base import SerializerProtocol
from pydantic import JsonValue

_SCALARS = (str, int, bool, type(None))


class ValueCodec:
    def __init__(self, serde: SerializerProtocol) -> None:
        self._serde = serde

    def encode(self, value: Any) -> JsonValue:
        kind = type(value)
        if kind in _SCALARS:
            scalar: JsonValue = value
            return scalar
        if kind is float:
            return value if math.isfinite(value) else self._opaque(value)
        if kind is list:
            return [self.encode(item) for item in value]
        if kind is dict and all(type(key) is str for key in value):
            encoded = {key: self.encode(item) for key, item in value.items()}
            if any(key.startswith("$") for key in value):
                return {"$dict": encoded}
            return encoded
        if isinstance(value, BaseMessage):
            return {"$message": message_to_dict(value)}
        return self._opaque(value)

    def decode(self, data: Any) -> Any:
        if type(data) is list:
            return [self.decode(item) for item in data]
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
                return {k: self.decode(v) for k, v in inner.items()}
        return {key: self.decode(item) for key, item in data.items()}

    def _opaque(self, value: Any) -> JsonValue:
        kind, data = self._serde.dumps_typed(value)
        return {"$serde": [kind, base64.b64encode(data).decode()]}
