"""Golden sessions: recorded from a real session, replayed against agent versions.

One session of the reference agent v2 (a real gateway and agent process) is recorded
once per test module; each version is then replayed against it in the sandbox, as
``shadowpod golden replay`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadowpod.gates.gate import build_judge, evaluate
from shadowpod.gates.golden import GOLDEN_FORMAT, GoldenFile, GoldenInvalid
from shadowpod.gates.policy import GatePolicy
from shadowpod.gates.replay import golden_turns, pairs_of
from shadowpod.gates.semantic import MiniLMEmbedder
from shadowpod.gates.verdicts import GateVerdict
from shadowpod.local.golden import replay_in_sandbox
from shadowpod.local.images import reference_images
from tests.gates.sessions import CONVERSATION, LEAKED_KEY, Recorded, record_in_own_loop


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return record_in_own_loop(tmp_path_factory.mktemp("golden"))


async def replay(
    recorded: Recorded, image: str, policy: GatePolicy, embedder: MiniLMEmbedder | None = None
) -> GateVerdict:
    report = await replay_in_sandbox(reference_images().resolve(image), recorded.golden)
    golden = GoldenFile.read(recorded.golden)
    judge = build_judge(policy, agent_patterns=report.nondeterministic, embedder=embedder)
    return await evaluate(policy, judge, pairs_of(golden, report))


def inbound_by_turn(recorded: Recorded) -> dict[int, str]:
    golden = GoldenFile.read(recorded.golden)
    return {turn.seq: turn.inbound.content for turn, _ in golden_turns(golden)}


def test_a_golden_file_holds_the_conversation_and_no_secret(recorded: Recorded) -> None:
    text = recorded.golden.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    header = lines[0]
    assert header["golden"] == GOLDEN_FORMAT and header["session"] == "s1"
    assert header["from_seq"] == 1 and header["to_seq"] == recorded.head
    # The key the user pasted and the token the recorder read with are not in it.
    assert LEAKED_KEY not in text and recorded.control_token not in text
    assert header["redacted"] >= 1 and "my key is [redacted]" in text
    golden = GoldenFile.read(recorded.golden)
    turns = list(golden_turns(golden))
    assert [t.inbound.content for t, _ in turns] == [*CONVERSATION, "my key is [redacted]"]
    name_turn = turns[3][0]
    assert name_turn.expected.replies == ["v2 > turn 4: your name is Ada (hi Ada)"]
    # Each turn starts from the source's state: after "my name is Ada" it knows the name.
    assert turns[3][1].memory["name"] == "Ada"
    weather = turns[2][0]
    assert [(c.tool, c.args, c.status) for c in weather.calls] == [
        ("weather", {"city": "Oslo"}, "ok")
    ]


def test_a_golden_file_of_another_format_or_broken_says_so(tmp_path: Path) -> None:
    newer = tmp_path / "newer.jsonl"
    newer.write_text('{"golden": 2, "session": "s1"}\n{"base": {}}\n')
    with pytest.raises(GoldenInvalid, match="golden format 2 is not one this version reads"):
        GoldenFile.read(newer)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(
        '{"golden": 1, "session": "s1", "from_seq": 1, "to_seq": 1}\n{"base": {}}\n{oops\n'
    )
    with pytest.raises(GoldenInvalid, match="line 3: not JSON"):
        GoldenFile.read(broken)


async def test_the_same_version_replays_its_golden_exactly(recorded: Recorded) -> None:
    verdict = await replay(recorded, "refagent:v2", GatePolicy(judge="exact", agreement=1.0))
    assert verdict.passed, [v.reason for v in verdict.turns if not v.agreed]
    assert verdict.compared == len(CONVERSATION) + 1


async def test_the_version_that_forgets_the_name_fails_the_golden(
    recorded: Recorded, embedder: MiniLMEmbedder
) -> None:
    verdict = await replay(
        recorded, "refagent:v2-forgetful", GatePolicy(judge="semantic"), embedder
    )
    assert not verdict.passed
    said = inbound_by_turn(recorded)
    failed = {said[v.turn]: v for v in verdict.turns if not v.agreed}
    assert sorted(failed) == ["what is my name?", "what's my name"], [
        (said[v.turn], v.reason) for v in verdict.turns
    ]
    assert failed["what is my name?"].got == "v2 > turn 4: I do not know your name yet"
    assert "similarity" in failed["what is my name?"].reason
    # Its other answers only lack the greeting: close enough for the judge.
    assert verdict.agreed == len(CONVERSATION) + 1 - 2


async def test_the_reworded_version_passes_with_the_semantic_judge_not_the_exact_one(
    recorded: Recorded, embedder: MiniLMEmbedder
) -> None:
    semantic = await replay(
        recorded, "refagent:v2-reworded", GatePolicy(judge="semantic"), embedder
    )
    assert semantic.passed, [(v.turn, v.reason) for v in semantic.turns if not v.agreed]
    exact = await replay(recorded, "refagent:v2-reworded", GatePolicy(judge="exact"))
    assert not exact.passed
    assert exact.agreement < 0.5
