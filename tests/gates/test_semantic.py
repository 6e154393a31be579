"""The semantic judge with the real all-MiniLM-L6-v2, loaded offline from its package."""

from __future__ import annotations

import os

from shadowpod.gates.answers import Answer, ToolCallRecord, TurnPair
from shadowpod.gates.normalise import Normaliser
from shadowpod.gates.semantic import MiniLMEmbedder, SemanticJudge


def pair(expected: str, got: str, turn: int) -> TurnPair:
    return TurnPair(
        turn=turn, inbound="", expected=Answer(replies=[expected]), got=Answer(replies=[got])
    )


async def test_a_reworded_answer_agrees_and_a_forgotten_name_does_not(
    embedder: MiniLMEmbedder,
) -> None:
    judge = SemanticJudge(embedder, threshold=0.8, normaliser=Normaliser())
    reworded, forgot = await judge.judge(
        [
            pair(
                "Hello Ada! I will remember that your favourite colour is green.",
                "Hi Ada, noted: your favourite colour is green, I'll keep that in mind.",
                1,
            ),
            pair(
                "Hello Ada! I will remember that your favourite colour is green.",
                "Hello! What is your name?",
                2,
            ),
        ]
    )
    assert reworded.agreed, reworded.reason
    assert not forgot.agreed, forgot.reason
    assert reworded.score > forgot.score
    assert "similarity" in forgot.reason and "threshold 0.80" in forgot.reason


async def test_the_model_loads_from_its_package_with_the_hub_switched_off(
    embedder: MiniLMEmbedder,
) -> None:
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    [vector] = embedder.embed(["hello"])
    assert len(vector) == 384
    assert abs(sum(x * x for x in vector) - 1.0) < 1e-4  # normalised


async def test_semantic_agreement_also_needs_the_same_tool_calls(embedder: MiniLMEmbedder) -> None:
    judge = SemanticJudge(embedder, threshold=0.8, normaliser=Normaliser())
    [verdict] = await judge.judge(
        [
            TurnPair(
                turn=1,
                inbound="",
                expected=Answer(replies=["done"], tool_calls=[ToolCallRecord(tool="refund")]),
                got=Answer(replies=["done"], tool_calls=[ToolCallRecord(tool="delete_account")]),
            )
        ]
    )
    assert not verdict.agreed and "delete_account" in verdict.reason
