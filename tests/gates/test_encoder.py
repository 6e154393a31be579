"""The numpy encoder gives sentence-transformers' embeddings of all-MiniLM-L6-v2.

``fixtures/minilm_reference.json`` holds vectors sentence-transformers (PyTorch, CPU)
computed for these texts, with the model from the same package
(``hack/minilm-reference.py`` made it, in a scratch venv with torch): short and long
texts, one past the 256-token limit, accents, emoji and CJK, and the empty string.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadowpod.gates.semantic import MiniLMEmbedder, cosine

REFERENCE = json.loads((Path(__file__).parent / "fixtures" / "minilm_reference.json").read_text())


def test_embeddings_match_sentence_transformers(embedder: MiniLMEmbedder) -> None:
    got = embedder.embed(REFERENCE["texts"])
    for text, vector, expected in zip(REFERENCE["texts"], got, REFERENCE["vectors"], strict=True):
        assert len(vector) == len(expected) == 384
        worst = max(abs(a - b) for a, b in zip(vector, expected, strict=True))
        assert worst < 1e-5, f"{text[:40]!r}: off by {worst}"


def test_a_batch_gives_each_text_what_it_gives_alone(embedder: MiniLMEmbedder) -> None:
    # Batched by length, so the long text is padded with nothing of the short ones.
    together = embedder.embed(REFERENCE["texts"])
    for text, vector in zip(REFERENCE["texts"], together, strict=True):
        [alone] = embedder.embed([text])
        assert cosine(vector, alone) == pytest.approx(1.0, abs=1e-6)
