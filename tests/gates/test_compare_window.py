"""In-place shadow compare on real processes: a shadow with a compare window open
answers every live turn in its sandbox as it follows the journal, from its own
in-memory state (so caches the journal does not hold count), and says so when it
was restarted and lost the window."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shadowpod.client.agent import compare_report
from shadowpod.engine.ports import CompareWindowLost, InstanceSpec
from shadowpod.gates.policy import GatePolicy
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images
from shadowpod.validator import WINDOW_TIMEOUT
from tests.agent.support import post, read_journal, replies, wait_answered

SESSION = "w"
OWNER = "w-owner"
SHADOW = "w-shadow"


@pytest.fixture
async def dep(tmp_path: Path) -> AsyncIterator[LocalDeployment]:
    async with LocalDeployment(tmp_path, reference_images()) as deployment:
        await deployment.create_session(SESSION, image="refagent:v2", instance=OWNER)
        await start_shadow(deployment)
        yield deployment


async def start_shadow(dep: LocalDeployment) -> None:
    spec = InstanceSpec(name=SHADOW, image="refagent:v2", session=SESSION, mode="shadow")
    await dep.runtime.start(spec)
    for _ in range(1500):
        status = await dep.runtime.status(SHADOW)
        head = await dep.control.head(SESSION)
        if status.ready and status.catchup_entries is not None and status.watermark >= head:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("the shadow did not catch up")


async def talk(dep: LocalDeployment, *texts: str) -> list[int]:
    async with dep.client() as client:
        seqs = [await post(client, text, SESSION) for text in texts]
        await wait_answered(dep.admin, seqs, SESSION)
    return seqs


def cache_id(reply: str) -> str:
    found = re.search(r"warm cache ([0-9a-f]+)", reply)
    assert found is not None, reply
    return found.group(1)


async def test_the_shadow_answers_live_turns_from_its_own_memory(dep: LocalDeployment) -> None:
    validator = dep.validator
    after = await validator.open_window(
        SESSION, instance=SHADOW, after_seq=await dep.control.head(SESSION)
    )
    seqs = await talk(dep, "my name is Ada", "warm?", "what is my name?", "warm?")
    count, to = await validator.completed_turns(SESSION, instance=SHADOW, after_seq=after)
    assert count == 4
    first_two = await validator.completed_turns(SESSION, instance=SHADOW, after_seq=after, up_to=2)
    assert first_two[0] == 2 and after < first_two[1] < to
    summary = await validator.compare(
        SESSION, "refagent:v2", instance=SHADOW, after_seq=after, to_seq=to,
        gate=GatePolicy(judge="exact", agreement=0.5),
    )  # fmt: skip
    # Same version, same state: only the in-memory cache differs (each process its own).
    assert (summary.compared, summary.agreed) == (4, 2)
    assert summary.passed

    instance = dep.runtime.instance(SHADOW)
    assert instance is not None
    report = await compare_report(
        validator.http, instance.url, after=after, to=to, timeout=WINDOW_TIMEOUT
    )
    answers = {a.turn: a.answer.text for a in report.answers}
    assert answers[seqs[2]].endswith("your name is Ada (hi Ada)")  # the window's own turn
    shadow_cache = {cache_id(answers[seqs[1]]), cache_id(answers[seqs[3]])}
    journal = await read_journal(dep.admin, SESSION)
    said = [str(r.payload["content"]) for r in replies(journal)]
    source_cache = {cache_id(reply) for reply in said if "warm cache" in reply}
    assert len(shadow_cache) == 1 and shadow_cache != source_cache

    # Another window later: the same process answers (no sandbox process per window).
    again = await validator.open_window(
        SESSION, instance=SHADOW, after_seq=await dep.control.head(SESSION)
    )
    [warm] = await talk(dep, "warm?")
    _, to = await validator.completed_turns(SESSION, instance=SHADOW, after_seq=again)
    report = await compare_report(
        validator.http, instance.url, after=again, to=to, timeout=WINDOW_TIMEOUT
    )
    assert {cache_id(a.answer.text) for a in report.answers} == shadow_cache
    # Nothing the shadow answered was journaled: one reply per message, the owner's.
    journal = await read_journal(dep.admin, SESSION)
    for seq in [*seqs, warm]:
        [reply] = [r for r in replies(journal) if r.payload.get("turn") == seq]
        assert reply.payload["meta"]["instance"] == OWNER  # type: ignore[index]


async def test_a_shadow_restarted_mid_window_says_it_lost_it(dep: LocalDeployment) -> None:
    validator = dep.validator
    after = await validator.open_window(
        SESSION, instance=SHADOW, after_seq=await dep.control.head(SESSION)
    )
    await talk(dep, "hello", "what is my name?")
    _, to = await validator.completed_turns(SESSION, instance=SHADOW, after_seq=after)
    await dep.runtime.kill(SHADOW)
    await start_shadow(dep)
    with pytest.raises(CompareWindowLost, match="no compare window open"):
        await validator.compare(
            SESSION, "refagent:v2", instance=SHADOW, after_seq=after, to_seq=to,
            gate=GatePolicy(judge="exact"),
        )  # fmt: skip
    # Asked for the same window, the restarted shadow opens one where it can answer.
    reopened = await validator.open_window(SESSION, instance=SHADOW, after_seq=after)
    assert reopened >= to > after


async def test_a_window_of_n_turns_answers_those_and_then_follows_as_before(
    dep: LocalDeployment,
) -> None:
    validator = dep.validator
    head = await dep.control.head(SESSION)
    after = await validator.open_window(SESSION, instance=SHADOW, after_seq=head, turns=2)
    seqs = await talk(dep, "hello", "what is my name?", "warm?", "hello again")
    _, to = await validator.completed_turns(SESSION, instance=SHADOW, after_seq=after)
    instance = dep.runtime.instance(SHADOW)
    assert instance is not None
    report = await compare_report(
        validator.http, instance.url, after=after, to=to, timeout=WINDOW_TIMEOUT
    )
    assert [a.turn for a in report.answers] == seqs[:2]  # the window's turns, no more
    status = await dep.runtime.status(SHADOW)
    assert status.watermark >= to  # and it went on following
