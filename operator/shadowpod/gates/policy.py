"""A gate policy: which judge, how close a turn must be, how many turns must agree.

judge: semantic           # exact | normalised | tool_calls | semantic | llm
agreement: 0.9            # the share of compared turns that must agree
similarity: 0.85          # semantic: the cosine similarity a turn needs
tool_calls: true          # semantic, llm: the tool calls must be the same too
min_turns: 1              # fewer turns compared than this fails the gate
nondeterministic: ["order #\\d+"]   # masked, with the agent's own declarations
llm: {url: "http://127.0.0.1:8000/v1", model: "judge", api_key_env: "JUDGE_API_KEY"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shadowpod.gates.normalise import compile_patterns

JudgeKind = Literal["exact", "normalised", "tool_calls", "semantic", "llm"]


class LLMEndpoint(BaseModel):
    """An OpenAI-compatible chat completions endpoint. The API key is read from the
    environment variable named here: it is never written in a policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(description="Base URL; the judge posts to {url}/chat/completions.")
    model: str
    api_key_env: str | None = None
    timeout_s: float = Field(60.0, gt=0)


class GatePolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    judge: JudgeKind = "semantic"
    agreement: float = Field(0.9, ge=0.0, le=1.0)
    similarity: float = Field(0.85, ge=0.0, le=1.0)
    tool_calls: bool = True
    min_turns: int = Field(1, ge=0)
    nondeterministic: list[str] = Field(default_factory=list)
    llm: LLMEndpoint | None = None

    @model_validator(mode="after")
    def _check(self) -> GatePolicy:
        if self.judge == "llm" and self.llm is None:
            raise ValueError("judge: llm needs an llm endpoint (url, model, api_key_env)")
        compile_patterns(self.nondeterministic)
        return self

    @classmethod
    def load(cls, path: Path) -> GatePolicy:
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read gate policy {path}: {exc}") from exc
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ValueError(f"gate policy {path} is invalid: {exc}") from exc
