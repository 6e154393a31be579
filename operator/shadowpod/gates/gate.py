"""A gate: the judge a policy names, run over the turns to compare, into a verdict."""

from __future__ import annotations

import os
from collections.abc import Sequence

from shadowpod.gates.answers import TurnPair
from shadowpod.gates.judges import ExactJudge, Judge, NormalisedJudge, ToolCallJudge
from shadowpod.gates.llm import ChatModel, LLMJudge
from shadowpod.gates.normalise import Normaliser
from shadowpod.gates.openai_http import OpenAIChatModel
from shadowpod.gates.policy import GatePolicy
from shadowpod.gates.semantic import Embedder, MiniLMEmbedder, SemanticJudge
from shadowpod.gates.verdicts import GateVerdict

_SHARED_EMBEDDER: MiniLMEmbedder | None = None


def shared_embedder() -> MiniLMEmbedder:
    """One model per process: loading it takes seconds, using it milliseconds."""
    global _SHARED_EMBEDDER
    if _SHARED_EMBEDDER is None:
        _SHARED_EMBEDDER = MiniLMEmbedder()
    return _SHARED_EMBEDDER


def chat_model(policy: GatePolicy) -> OpenAIChatModel:
    assert policy.llm is not None
    key = os.environ.get(policy.llm.api_key_env) if policy.llm.api_key_env else None
    if policy.llm.api_key_env and not key:
        raise ValueError(
            f"the LLM judge's API key is read from ${policy.llm.api_key_env}, which is not set"
        )
    return OpenAIChatModel(
        policy.llm.url, model=policy.llm.model, api_key=key, timeout_s=policy.llm.timeout_s
    )


def build_judge(
    policy: GatePolicy,
    *,
    agent_patterns: Sequence[str] = (),
    embedder: Embedder | None = None,
    chat: ChatModel | None = None,
) -> Judge:
    normaliser = Normaliser([*policy.nondeterministic, *agent_patterns])
    if policy.judge == "exact":
        return ExactJudge()
    if policy.judge == "normalised":
        return NormalisedJudge(normaliser)
    if policy.judge == "tool_calls":
        return ToolCallJudge(normaliser)
    if policy.judge == "semantic":
        return SemanticJudge(
            embedder or shared_embedder(),
            threshold=policy.similarity,
            normaliser=normaliser,
            tool_calls=policy.tool_calls,
        )
    if chat is None:
        raise ValueError("the LLM judge needs a chat model (see chat_model)")
    return LLMJudge(chat, normaliser=normaliser, tool_calls=policy.tool_calls)


async def evaluate(policy: GatePolicy, judge: Judge, pairs: Sequence[TurnPair]) -> GateVerdict:
    verdicts = await judge.judge(pairs) if pairs else []
    return GateVerdict(
        judge=judge.name, threshold=policy.agreement, turns=verdicts, min_turns=policy.min_turns
    )
