"""The agent API's sandbox (``POST /v1/sandbox/replay``) on a real agent process:
the instance answers a golden file in its own process, from the golden's state, and
its own state and journal stay as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from shadowpod.domain.entries import JournalEntry
from shadowpod.gates.replay import SandboxReport
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images
from tests.agent.support import of_kind, read_journal, wait_for
from tests.gates.sessions import record_reference_session

SESSION = "other"


async def test_an_instance_answers_a_golden_file_in_its_sandbox(tmp_path: Path) -> None:
    golden = (await record_reference_session(tmp_path / "recording")).golden
    async with LocalDeployment(tmp_path / "dep", reference_images()) as dep:
        await dep.create_session(SESSION, image="refagent:v2-forgetful", instance="forgetful-1")
        instance = dep.runtime.instance("forgetful-1")
        assert instance is not None

        async with aiohttp.ClientSession() as http:
            # Settled: its on_owner hook has started (and journaled) its background
            # indexer, and the instance has folded that entry back into its own state.
            async def settled() -> tuple[list[JournalEntry], dict[str, Any]] | None:
                entries = await read_journal(dep.admin, SESSION)
                async with http.get(f"{instance.url}/v1/state") as response:
                    state: dict[str, Any] = await response.json()
                folded = entries and state["watermark"] == entries[-1].seq
                return (entries, state) if of_kind(entries, "process") and folded else None

            journal, state = await wait_for(settled, "the indexer journaled and folded")
            async with http.post(
                f"{instance.url}/v1/sandbox/replay",
                data=golden.read_bytes(),
                headers={"Content-Type": "application/x-ndjson"},
            ) as response:
                assert response.status == 200, await response.text()
                report = SandboxReport.model_validate_json(await response.read())
            async with http.get(f"{instance.url}/v1/state") as response:
                assert await response.json() == state  # its own state untouched
        assert await read_journal(dep.admin, SESSION) == journal  # nothing journaled

    assert (report.agent, report.version) == ("refagent", "2-forgetful")
    replies = [reply for answer in report.answers for reply in answer.answer.replies]
    assert len(report.answers) == 8  # every turn of the golden file
    # Answered by this version, from the golden's state: the name told to v2 is lost.
    assert sum("I do not know your name yet" in reply for reply in replies) == 2
    # The charge was answered from the recording (its receipt), not charged again.
    assert any("'receipt': 'r-10'" in reply for reply in replies)


async def test_requests_the_sandbox_cannot_take_are_refused_saying_why(tmp_path: Path) -> None:
    async with LocalDeployment(tmp_path, reference_images()) as dep:
        await dep.create_session(SESSION, image="refagent:v2", instance="v2-1")
        instance = dep.runtime.instance("v2-1")
        assert instance is not None
        async with aiohttp.ClientSession() as http:
            for body, said in (
                (b'{"golden": 1}\nnot json\n', "line 2: not JSON"),
                (b'{"golden": 7, "session": "s"}\n{"base": {}}\n', "record it again"),
                (b"", "found 0 line(s)"),
            ):
                async with http.post(f"{instance.url}/v1/sandbox/replay", data=body) as response:
                    assert response.status == 400
                    error = await response.json()
                assert error["error"] == "GoldenInvalid"
                assert said in error["message"]
            window = f"{instance.url}/v1/compare/window"
            async with http.post(window, json={"after": "ten"}) as response:
                assert response.status == 400
                assert "after must be a seq" in (await response.json())["message"]
            async with http.post(window, json={"after": 3}) as response:
                assert response.status == 409  # an owner has nothing to compare
                assert (await response.json())["error"] == "NotShadow"
            async with http.get(f"{instance.url}/v1/compare?after=3") as response:
                assert response.status == 400
