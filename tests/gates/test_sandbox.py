"""The sandbox: the same Turn API, but nothing leaves it (run in this process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import JsonValue

from shadowpod.agent import Agent, Turn
from shadowpod.agent.sandbox import replay_golden
from shadowpod.gates.golden import GoldenFile
from tests.gates.sessions import Recorded, record_in_own_loop


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return record_in_own_loop(tmp_path_factory.mktemp("sandbox"))


def candidate(ran: list[str], *, overcharge: bool = False) -> Agent:
    """A version with the reference agent's tools, whose tools would leave a trace."""
    agent = Agent("candidate", version="9", state_schema=2)  # reads what v2 wrote
    agent.nondeterministic(r"order-\d+")

    @agent.tool(idempotent=True)
    async def weather(city: str) -> JsonValue:
        ran.append(f"weather {city}")
        return {"city": city, "forecast": "made up"}

    @agent.tool()
    async def charge(amount: str) -> JsonValue:
        ran.append(f"charge {amount}")
        return {"charged": amount}

    @agent.on_message
    async def handle(turn: Turn) -> None:
        if turn.content.startswith("weather "):
            result = await turn.tool("weather", {"city": turn.content.split()[1]})
            await turn.reply(f"weather: {result}")
        elif turn.content.startswith("charge "):
            amount = "1000" if overcharge else turn.content.split()[1]
            await turn.reply(f"charged: {await turn.tool('charge', {'amount': amount})}")
        elif turn.content.startswith("my name is"):
            turn.remember("name", "Ada")
            await turn.spawn("indexer", ["sleep", "600"])
        else:
            await turn.reply(f"{turn.content} ({turn.memory.get('name')})")

    return agent


async def test_tool_calls_are_answered_from_the_recording_and_never_run(
    recorded: Recorded,
) -> None:
    ran: list[str] = []
    report = await replay_golden(candidate(ran), GoldenFile.read(recorded.golden))
    assert ran == []  # no tool ran for real
    by_content = {a.turn: a for a in report.answers}
    answers = [a.answer for a in by_content.values()]
    assert "v2" not in str(answers)  # answers are the candidate's own...
    weather = next(a for a in answers if a.tool_calls and a.tool_calls[0].tool == "weather")
    # ...from the forecast the source got, not the candidate's made-up one.
    assert weather.replies == ["weather: {'city': 'Oslo', 'forecast': 'snow'}"]
    assert report.nondeterministic == [r"order-\d+"]
    # Turns read the source's state: the name the source remembered.
    assert any(a.replies == ["hello there (Ada)"] for a in answers)


async def test_a_call_the_recording_lacks_and_a_background_process_are_refused(
    recorded: Recorded,
) -> None:
    ran: list[str] = []
    report = await replay_golden(candidate(ran, overcharge=True), GoldenFile.read(recorded.golden))
    assert ran == []
    refused = [r for a in report.answers for r in a.refused]
    assert "tool charge({'amount': '1000'}): not in the recording" in refused
    assert "background process 'indexer'" in refused
    charge = next(a for a in report.answers if any("charge" in r for r in a.refused))
    [reply] = charge.answer.replies
    assert reply.startswith("error while handling this message")


def test_a_bad_nondeterministic_pattern_fails_where_it_is_declared(tmp_path: Path) -> None:
    agent = Agent("x", version="1")
    with pytest.raises(ValueError, match="not a regex"):
        agent.nondeterministic("[unclosed")
