"""The judges that need no model, on answers a reference agent could give."""

from __future__ import annotations

import pytest

from shadowpod.gates.answers import Answer, ToolCallRecord, TurnPair
from shadowpod.gates.gate import build_judge, evaluate
from shadowpod.gates.judges import ExactJudge, NormalisedJudge, ToolCallJudge
from shadowpod.gates.normalise import Normaliser
from shadowpod.gates.policy import GatePolicy


def pair(
    said: str,
    says: str,
    turn: int = 1,
    expected: list[ToolCallRecord] | None = None,
    got: list[ToolCallRecord] | None = None,
) -> TurnPair:
    return TurnPair(
        turn=turn,
        inbound="hi",
        expected=Answer(replies=[said], tool_calls=expected or []),
        got=Answer(replies=[says], tool_calls=got or []),
    )


async def test_exact_judge_tells_a_changed_character_and_says_where() -> None:
    same, changed = await ExactJudge().judge(
        [pair("hello Ada", "hello Ada"), pair("hello Ada", "hello ada", turn=2)]
    )
    assert same.agreed and same.score == 1.0
    assert not changed.agreed
    assert "character 6" in changed.reason and "got …'hello ada'" in changed.reason


async def test_normalised_judge_masks_case_space_timestamps_ids_and_declared_spans() -> None:
    normaliser = Normaliser([r"order #\d+"])
    verdicts = await NormalisedJudge(normaliser).judge(
        [
            pair(
                "Booked at 2026-11-25T21:03:04.123Z, ref 3f2a8c1e-0b6d-4c39-9a1e-5f0d2b7c8e91.",
                "booked  at 2026-11-26T08:00:00Z,\nREF 0c1d2e3f-4a5b-6c7d-8e9f-a0b1c2d3e4f5.",
            ),
            pair("Your order #1234 ships today", "your order #98 ships today", turn=2),
            pair("hello Ada", "hello stranger", turn=3),
        ]
    )
    assert [v.agreed for v in verdicts] == [True, True, False]
    assert "stranger" in verdicts[2].reason


async def test_tool_call_judge_wants_the_same_tools_arguments_and_order() -> None:
    lookup = ToolCallRecord(tool="lookup", args={"who": "Ada"})
    shout = ToolCallRecord(tool="shout", args={"text": "ada"})
    judge = ToolCallJudge(Normaliser())
    same, reordered, other_args, missing = await judge.judge(
        [
            pair("a", "b", expected=[lookup, shout], got=[lookup, shout]),
            pair("a", "a", turn=2, expected=[lookup, shout], got=[shout, lookup]),
            pair(
                "a",
                "a",
                turn=3,
                expected=[lookup],
                got=[ToolCallRecord(tool="lookup", args={"who": "Bob"})],
            ),
            pair("a", "a", turn=4, expected=[lookup, shout], got=[lookup]),
        ]
    )
    assert same.agreed  # replies are not this judge's business
    assert not reordered.agreed and "expected 'lookup', got 'shout'" in reordered.reason
    assert not other_args.agreed and "Bob" in other_args.reason
    assert (
        not missing.agreed
        and missing.score == 0.5
        and "expected 2 tool call(s), got 1" in missing.reason
    )


async def test_a_gate_passes_on_the_share_of_turns_the_policy_asks_for() -> None:
    policy = GatePolicy(judge="exact", agreement=0.75)
    pairs = [pair("x", "x", turn=n) for n in range(1, 4)] + [pair("x", "y", turn=4)]
    verdict = await evaluate(policy, build_judge(policy), pairs)
    assert verdict.agreement == 0.75 and verdict.passed
    assert [v.turn for v in verdict.worst()] == [4]
    stricter = GatePolicy(judge="exact", agreement=0.8)
    failed = await evaluate(stricter, build_judge(stricter), pairs)
    assert not failed.passed
    assert failed.summary().startswith("FAILED: 3/4 turns agree (75%)")


async def test_a_gate_with_fewer_turns_than_the_policy_asks_for_fails() -> None:
    policy = GatePolicy(judge="exact", min_turns=3)
    verdict = await evaluate(policy, build_judge(policy), [pair("x", "x")])
    assert verdict.agreement == 1.0 and not verdict.passed
    assert "at least 3 turns" in verdict.summary()


def test_a_policy_says_what_is_wrong_with_it() -> None:
    with pytest.raises(ValueError, match="judge: llm needs an llm endpoint"):
        GatePolicy(judge="llm")
    with pytest.raises(ValueError, match=r"pattern '\(unclosed' is not a regex"):
        GatePolicy(nondeterministic=["(unclosed"])
    with pytest.raises(ValueError, match="agreement"):
        GatePolicy(agreement=1.5)
