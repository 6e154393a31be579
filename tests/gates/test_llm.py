"""The LLM judge against a local server that speaks the OpenAI chat completions API.

The server's "model" is a rule a test can predict: the candidate agrees when it names
everyone the expected answer names (capitalised words). Everything else is real: the
HTTP request the judge makes, the JSON it gets back, how it reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from shadowpod.gates.answers import Answer, TurnPair
from shadowpod.gates.gate import build_judge, chat_model, evaluate
from shadowpod.gates.llm import JudgeUnavailable
from shadowpod.gates.policy import GatePolicy, LLMEndpoint

KEY = "judge-key-123"


@dataclass
class ChatServer:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    reply: str | None = None  # what to answer instead of the rule's verdict
    status: int = 200


def names(text: str) -> set[str]:
    return set(re.findall(r"\b[A-Z][a-z]+\b", text))


@pytest.fixture
async def chat_server() -> AsyncIterator[ChatServer]:
    server = ChatServer(url="")

    async def completions(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        body = await request.json()
        server.requests.append(body)
        if server.status != 200:
            return web.json_response({"error": {"message": "overloaded"}}, status=server.status)
        prompt = body["messages"][-1]["content"]
        expected = prompt.split("EXPECTED:\n", 1)[1].split("\n\nCANDIDATE:\n", 1)[0]
        candidate = prompt.split("CANDIDATE:\n", 1)[1]
        missing = names(expected) - names(candidate)
        content = server.reply or json.dumps(
            {
                "agree": not missing,
                "score": 0.2 if missing else 0.9,
                "reason": f"it forgets {sorted(missing)}" if missing else "same meaning",
            }
        )
        return web.json_response(
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.5", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    server.url = f"http://{host}:{port}/v1"
    yield server
    await runner.cleanup()


def policy(url: str) -> GatePolicy:
    return GatePolicy(
        judge="llm",
        agreement=1.0,
        llm=LLMEndpoint(url=url, model="judge-small", api_key_env="TEST_JUDGE_KEY"),
    )


def pair(turn: int, expected: str, got: str) -> TurnPair:
    return TurnPair(
        turn=turn,
        inbound="what is my name?",
        expected=Answer(replies=[expected]),
        got=Answer(replies=[got]),
    )


async def test_the_llm_judge_keeps_each_turns_verdict_and_reason(
    chat_server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    gate = policy(chat_server.url)
    async with chat_model(gate) as chat:
        verdict = await evaluate(
            gate,
            build_judge(gate, chat=chat),
            [
                pair(1, "Your name is Ada.", "Your name, as you told me, is Ada."),
                pair(2, "Your name is Ada.", "Your name? I do not know it."),
                pair(3, "Your name is Ada.", "your name is  ada."),  # equal once normalised
            ],
        )
    assert [v.agreed for v in verdict.turns] == [True, False, True]
    assert verdict.turns[1].reason == "the model: it forgets ['Ada']"
    assert verdict.turns[1].score == 0.2
    assert not verdict.passed
    # The model was asked twice (turn 3 needed no model), with the chat completions body.
    assert len(chat_server.requests) == 2
    request = chat_server.requests[0]
    assert request["model"] == "judge-small" and request["temperature"] == 0
    assert [m["role"] for m in request["messages"]] == ["system", "user"]


async def test_an_answer_the_judge_cannot_read_is_a_disagreement_that_says_so(
    chat_server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    chat_server.reply = "I think they are the same"
    gate = policy(chat_server.url)
    async with chat_model(gate) as chat:
        [verdict] = await build_judge(gate, chat=chat).judge([pair(1, "Ada", "Ada Lovelace")])
    assert not verdict.agreed
    assert "no JSON object in the judge's answer" in verdict.reason


async def test_an_endpoint_that_fails_or_is_missing_is_an_error_not_a_verdict(
    chat_server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    chat_server.status = 503
    gate = policy(chat_server.url)
    async with chat_model(gate) as chat:
        with pytest.raises(JudgeUnavailable, match="answered 503"):
            await build_judge(gate, chat=chat).judge([pair(1, "Ada", "Bob")])
    gone = policy("http://127.0.0.5:9/v1")
    async with chat_model(gone) as chat:
        with pytest.raises(JudgeUnavailable, match="cannot be reached"):
            await build_judge(gone, chat=chat).judge([pair(1, "Ada", "Bob")])


def test_the_api_key_comes_from_the_environment_and_its_absence_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TEST_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match=r"\$TEST_JUDGE_KEY, which is not set"):
        chat_model(policy("http://127.0.0.5:1/v1"))
