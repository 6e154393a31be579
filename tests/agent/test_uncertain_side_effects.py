"""Uncertain side effects: the owner dies after journaling a tool call's intent and
before its result. The next owner must not blindly repeat a call that may already
have had its effect (DESIGN.md §1, tool-call history).

The tools of the ``sidefx`` agent append a line to a file every time they run, so
the file says how many times the side effect really happened.
"""

from __future__ import annotations

from pathlib import Path

from shadowpod.api.models import OwnershipChange
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.state import CallStatus
from shadowpod.engine.ports import InstanceSpec
from shadowpod.local.deployment import LocalDeployment
from tests.agent.support import (
    SESSION,
    folded,
    lines_of,
    of_kind,
    post,
    read_journal,
    replies_to,
    wait_answered,
    wait_for,
)


async def crash_during_tool_call(
    dep: LocalDeployment,
    client: GatewayClient,
    side_effects: Path,
    command: str,
    *,
    next_image: str = "sidefx:fast",
) -> tuple[int, list[JournalEntry]]:
    """Run ``command`` on a first owner whose tool never returns, SIGKILL that owner
    while the tool runs, and hand the session to a second owner at epoch 2. Returns
    the turn and the journal once the second owner has finished it."""
    await dep.create_session(SESSION, image="sidefx:slow", instance="first")
    seq = await post(client, command)
    call_id = f"{seq}:1"

    async def tool_running() -> bool | None:
        lines = lines_of(side_effects)
        intents = of_kind(await read_journal(dep.admin), EntryKind.TOOL_CALL)
        return (len(lines) == 1 and [e.payload["call_id"] for e in intents] == [call_id]) or None

    await wait_for(tool_running, "the tool to be running, its intent journaled")
    await dep.runtime.kill("first")
    entries = await read_journal(dep.admin)
    assert of_kind(entries, EntryKind.TOOL_RESULT) == []
    assert folded(entries).tools.uncertain()[0].call_id == call_id

    await dep.admin.set_ownership(SESSION, OwnershipChange(expect_epoch=1, epoch=2, owner="second"))
    await dep.runtime.start(
        InstanceSpec(name="second", image=next_image, session=SESSION, mode="owner", epoch=2)
    )
    return seq, await wait_answered(dep.admin, [seq])


async def test_a_non_idempotent_call_of_unknown_outcome_is_not_repeated(
    dep: LocalDeployment, client: GatewayClient, tmp_path: Path
) -> None:
    side_effects = tmp_path / "sidefx.log"
    seq, entries = await crash_during_tool_call(dep, client, side_effects, "book table-for-two")
    call_id = f"{seq}:1"

    # The side effect happened exactly once: the new owner did not run the tool again.
    (line,) = lines_of(side_effects)
    assert line.startswith("book table-for-two ")
    # Its decision is on the record: the call is abandoned, by the new owner.
    assert [e.payload["call_id"] for e in of_kind(entries, EntryKind.TOOL_CALL)] == [call_id]
    (result,) = of_kind(entries, EntryKind.TOOL_RESULT)
    assert result.payload["call_id"] == call_id
    assert (result.payload["status"], result.epoch) == ("abandoned", 2)
    assert folded(entries).tools.calls[call_id].status is CallStatus.ABANDONED
    # The user gets exactly one reply, which says the action could not be confirmed.
    (reply,) = replies_to(entries, seq)
    assert reply.epoch == 2 and reply.seq > result.seq
    assert reply.payload["content"].startswith("I could not confirm an earlier action")
    assert "'book'" in reply.payload["content"]
    assert reply.payload["meta"]["error"] == "tool_abandoned"

    # And the session goes on with the new owner.
    after = await post(client, "thanks")
    (next_reply,) = replies_to(await wait_answered(dep.admin, [after]), after)
    assert next_reply.payload["content"] == "heard: thanks"
    assert next_reply.payload["meta"]["instance"] == "second"
    assert len(lines_of(side_effects)) == 1


async def test_an_idempotent_call_of_unknown_outcome_is_repeated(
    dep: LocalDeployment, client: GatewayClient, tmp_path: Path
) -> None:
    side_effects = tmp_path / "sidefx.log"
    seq, entries = await crash_during_tool_call(dep, client, side_effects, "lookup flights")
    call_id = f"{seq}:1"

    # It ran again, in the new owner, under the same call id (one intent, one result).
    lines = lines_of(side_effects)
    assert len(lines) == 2 and all(line.startswith("lookup flights") for line in lines)
    assert lines[0] != lines[1]  # two different processes
    assert [e.payload["call_id"] for e in of_kind(entries, EntryKind.TOOL_CALL)] == [call_id]
    (result,) = of_kind(entries, EntryKind.TOOL_RESULT)
    assert result.payload["call_id"] == call_id
    assert (result.payload["status"], result.epoch) == ("ok", 2)
    assert result.payload["result"] == {"done": "lookup flights"}
    # The user gets the normal answer, once.
    (reply,) = replies_to(entries, seq)
    assert reply.epoch == 2
    assert reply.payload["content"] == "lookup done: {'done': 'lookup flights'}"
    assert "error" not in reply.payload["meta"]


async def test_the_new_owner_decides_about_an_uncertain_call_as_it_takes_over(
    dep: LocalDeployment, client: GatewayClient, tmp_path: Path
) -> None:
    """Even when the redone turn does not make the call again (an LLM may well decide
    otherwise the second time), the new owner records that it did not repeat it: no
    call stays uncertain forever."""
    side_effects = tmp_path / "sidefx.log"
    seq, entries = await crash_during_tool_call(
        dep, client, side_effects, "book table-for-two", next_image="sidefx:changed-mind"
    )
    call_id = f"{seq}:1"

    assert len(lines_of(side_effects)) == 1
    (result,) = of_kind(entries, EntryKind.TOOL_RESULT)
    assert result.payload["call_id"] == call_id
    assert (result.payload["status"], result.epoch) == ("abandoned", 2)
    assert folded(entries).tools.uncertain() == []
    (reply,) = replies_to(entries, seq)
    assert reply.payload["content"] == "on second thought, no book"
    assert result.seq < reply.seq
