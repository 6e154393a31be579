"""The judges that need no model: exact text, normalised text, tool-call structure.

A judge takes the turns to compare and gives one ``TurnVerdict`` each, with its score
and its reason in words a person reads in a report. Judges that call a model
(``semantic``, ``llm``) implement the same ``Judge`` protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

from shadowpod.gates.answers import ToolCallRecord, TurnPair
from shadowpod.gates.normalise import Normaliser
from shadowpod.gates.verdicts import TurnVerdict

_SHOWN: Final = 40  # characters of context in a reason


class Judge(Protocol):
    @property
    def name(self) -> str: ...

    async def judge(self, pairs: Sequence[TurnPair]) -> list[TurnVerdict]: ...


def first_difference(expected: str, got: str) -> str:
    """Where two texts part, with a little of each from there."""
    at = next(
        (i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b),
        min(len(expected), len(got)),
    )
    start = max(0, at - 10)
    return (
        f"differs at character {at}: expected …{expected[start : at + _SHOWN]!r}, "
        f"got …{got[start : at + _SHOWN]!r}"
    )


def verdict(pair: TurnPair, agreed: bool, score: float, reason: str) -> TurnVerdict:
    return TurnVerdict(
        turn=pair.turn,
        agreed=agreed,
        score=min(1.0, max(0.0, score)),
        reason=reason,
        expected=pair.expected.text,
        got=pair.got.text,
    )


class ExactJudge:
    """The same replies, character for character, and the same tool calls."""

    name = "exact"

    async def judge(self, pairs: Sequence[TurnPair]) -> list[TurnVerdict]:
        return [self._one(pair) for pair in pairs]

    def _one(self, pair: TurnPair) -> TurnVerdict:
        if pair.expected.text != pair.got.text:
            return verdict(
                pair, False, 0.0, "reply " + first_difference(pair.expected.text, pair.got.text)
            )
        calls = compare_calls(
            pair.expected.tool_calls, pair.got.tool_calls, Normaliser(builtin=False)
        )
        if calls is not None:
            return verdict(pair, False, 0.0, calls)
        return verdict(pair, True, 1.0, "identical")


class NormalisedJudge:
    """Replies equal once case, whitespace and nondeterministic spans are masked; tool
    calls structurally equal under the same masking."""

    name = "normalised"

    def __init__(self, normaliser: Normaliser) -> None:
        self.normaliser = normaliser

    async def judge(self, pairs: Sequence[TurnPair]) -> list[TurnVerdict]:
        return [self._one(pair) for pair in pairs]

    def _one(self, pair: TurnPair) -> TurnVerdict:
        expected = self.normaliser.text(pair.expected.text)
        got = self.normaliser.text(pair.got.text)
        if expected != got:
            return verdict(pair, False, 0.0, "normalised reply " + first_difference(expected, got))
        calls = compare_calls(pair.expected.tool_calls, pair.got.tool_calls, self.normaliser)
        if calls is not None:
            return verdict(pair, False, 0.0, calls)
        return verdict(pair, True, 1.0, "equal once normalised")


class ToolCallJudge:
    """The same tools with the same arguments in the same order; replies not read."""

    name = "tool_calls"

    def __init__(self, normaliser: Normaliser) -> None:
        self.normaliser = normaliser

    async def judge(self, pairs: Sequence[TurnPair]) -> list[TurnVerdict]:
        return [self._one(pair) for pair in pairs]

    def _one(self, pair: TurnPair) -> TurnVerdict:
        expected, got = pair.expected.tool_calls, pair.got.tool_calls
        difference = compare_calls(expected, got, self.normaliser)
        if difference is None:
            return verdict(pair, True, 1.0, f"the same {len(expected)} tool call(s)")
        same = sum(
            1
            for a, b in zip(expected, got, strict=False)
            if _key(a, self.normaliser) == _key(b, self.normaliser)
        )
        return verdict(pair, False, same / max(len(expected), len(got)), difference)


def _key(call: ToolCallRecord, normaliser: Normaliser) -> tuple[str, object]:
    return call.tool, normaliser.value(call.args)


def compare_calls(
    expected: Sequence[ToolCallRecord], got: Sequence[ToolCallRecord], normaliser: Normaliser
) -> str | None:
    """``None`` when both made the same calls in the same order; else the first difference."""
    for n, (a, b) in enumerate(zip(expected, got, strict=False), start=1):
        if a.tool != b.tool:
            return f"tool call #{n}: expected {a.tool!r}, got {b.tool!r}"
        if normaliser.value(a.args) != normaliser.value(b.args):
            return f"tool call #{n} ({a.tool}): expected arguments {a.args}, got {b.args}"
    if len(expected) != len(got):
        return f"expected {len(expected)} tool call(s), got {len(got)}"
    return None
