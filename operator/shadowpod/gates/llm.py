"""The LLM judge: a model the user configures reads both answers and says whether the
candidate's means the same. The model is reached through a ``ChatModel`` port
(``shadowpod.gates.openai_http`` speaks the OpenAI-compatible chat completions API)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from typing import Final, Protocol

from shadowpod.gates.answers import TurnPair
from shadowpod.gates.judges import compare_calls, verdict
from shadowpod.gates.normalise import Normaliser
from shadowpod.gates.verdicts import TurnVerdict

SYSTEM_PROMPT: Final = (
    "You compare two answers an AI agent gave to the same message in the same "
    "conversation: the EXPECTED one (from the version in production) and the "
    "CANDIDATE one (from a new version). Decide whether the candidate is as good and "
    "says the same things: the same facts, the same names, the same decisions; "
    "wording, tone and order may differ. Reply with one JSON object only: "
    '{"agree": true or false, "score": a number from 0 to 1, "reason": "one sentence"}'
)
_PARALLEL: Final = 4
_OBJECT: Final = re.compile(r"\{.*\}", re.DOTALL)


class JudgeUnavailable(RuntimeError):
    """The judge's model could not be asked (endpoint down, refused, bad answer)."""


class ChatModel(Protocol):
    async def complete(self, messages: Sequence[dict[str, str]]) -> str: ...


def judge_prompt(pair: TurnPair) -> list[dict[str, str]]:
    user = (
        f"MESSAGE:\n{pair.inbound}\n\nEXPECTED:\n{pair.expected.text}\n\n"
        f"CANDIDATE:\n{pair.got.text}"
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_judgement(text: str) -> tuple[bool, float, str]:
    """The model's JSON verdict; ``ValueError`` saying what is wrong with it."""
    found = _OBJECT.search(text)
    if found is None:
        raise ValueError(f"no JSON object in the judge's answer: {text[:200]!r}")
    try:
        data = json.loads(found.group(0))
    except ValueError as exc:
        raise ValueError(f"the judge's answer is not JSON: {text[:200]!r}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("agree"), bool):
        raise ValueError(f"the judge's answer has no boolean 'agree': {text[:200]!r}")
    agree = data["agree"]
    score = data.get("score", 1.0 if agree else 0.0)
    if isinstance(score, bool) or not isinstance(score, int | float):
        score = 1.0 if agree else 0.0
    return agree, float(score), str(data.get("reason", ""))


class LLMJudge:
    name = "llm"

    def __init__(
        self, model: ChatModel, *, normaliser: Normaliser, tool_calls: bool = True
    ) -> None:
        self.model = model
        self.normaliser = normaliser
        self.tool_calls = tool_calls

    async def judge(self, pairs: Sequence[TurnPair]) -> list[TurnVerdict]:
        limit = asyncio.Semaphore(_PARALLEL)

        async def one(pair: TurnPair) -> TurnVerdict:
            async with limit:
                return await self._one(pair)

        return list(await asyncio.gather(*(one(pair) for pair in pairs)))

    async def _one(self, pair: TurnPair) -> TurnVerdict:
        calls = (
            compare_calls(pair.expected.tool_calls, pair.got.tool_calls, self.normaliser)
            if self.tool_calls
            else None
        )
        if calls is not None:
            return verdict(pair, False, 0.0, calls)
        if self.normaliser.text(pair.expected.text) == self.normaliser.text(pair.got.text):
            return verdict(pair, True, 1.0, "equal once normalised (the model was not asked)")
        answer = await self.model.complete(judge_prompt(pair))
        try:
            agree, score, reason = parse_judgement(answer)
        except ValueError as exc:
            return verdict(pair, False, 0.0, str(exc))
        return verdict(
            pair, agree, score, f"the model: {reason}" if reason else "the model said so"
        )
