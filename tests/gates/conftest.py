"""Upgrade gates' fixtures: the embedding model, loaded once per test session."""

from __future__ import annotations

import pytest

from shadowpod.gates.gate import shared_embedder
from shadowpod.gates.semantic import MiniLMEmbedder, SemanticUnavailable


@pytest.fixture(scope="session")
def embedder() -> MiniLMEmbedder:
    model = shared_embedder()
    try:
        model.load()
    except SemanticUnavailable as exc:  # the `semantic` extra is part of `dev`
        pytest.skip(str(exc))
    return model
