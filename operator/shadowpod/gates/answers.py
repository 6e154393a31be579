"""What a turn answered: the replies a user saw and the tool calls it made, in order.

Judges compare two ``Answer``s of the same turn: the one the journal recorded (the
source, or a golden file) and the one a candidate version gave in the sandbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue

_ASSISTANT = "assistant"


class ToolCallRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str
    args: dict[str, JsonValue] = {}


class Answer(BaseModel):
    """A turn's observable output."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replies: list[str] = []
    tool_calls: list[ToolCallRecord] = []

    @property
    def text(self) -> str:
        """The replies as one text, as the user read them."""
        return "\n".join(self.replies)

    @classmethod
    def of_outputs(cls, outputs: Iterable[tuple[str, Mapping[str, Any]]]) -> Answer:
        """The answer in a turn's outputs, as (kind, payload) pairs in journal order."""
        replies: list[str] = []
        calls: list[ToolCallRecord] = []
        for kind, payload in outputs:
            if kind == "message" and payload.get("role") == _ASSISTANT:
                replies.append(str(payload.get("content", "")))
            elif kind == "tool_call":
                args = payload.get("args") or {}
                calls.append(ToolCallRecord(tool=str(payload.get("tool")), args=dict(args)))
        return cls(replies=replies, tool_calls=calls)


class TurnPair(BaseModel):
    """One turn to judge: what came in, what was answered, what the candidate answered."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    turn: int  # the inbound seq
    inbound: str
    expected: Answer
    got: Answer
