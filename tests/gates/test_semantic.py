"""The semantic judge with the real all-MiniLM-L6-v2, loaded offline from its package."""

from __future__ import annotations

import subprocess
import sys

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


def test_the_model_loads_from_its_package_without_pytorch_or_a_hub(
    embedder: MiniLMEmbedder,
) -> None:
    # A process of its own: what loading the model imports, and nothing else.
    script = (
        "import sys\n"
        "from shadowpod.gates.semantic import MiniLMEmbedder\n"
        "[v] = MiniLMEmbedder().embed(['hello'])\n"
        "print(len(v), round(sum(x * x for x in v), 4))\n"
        "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers',\n"
        "    'huggingface_hub') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    size_and_norm, heavy = done.stdout.splitlines()
    assert size_and_norm == "384 1.0"  # a normalised 384-dimensional embedding
    assert heavy == "[]"


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
