"""The agent's own state grows by deltas: a long session's per-turn write stays the
size of the turn's change, whatever layout the agent keeps its state in, and a
migration (snapshot, deltas after it, another image) gives the new owner the same
state. Measured on the journal itself, with the real gateway and agent processes."""

from __future__ import annotations

from pathlib import Path

import orjson

from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.schema import dump_state, load_state
from shadowpod.engine.record import InstanceRef, MigrationPolicy, Phase
from shadowpod.local.deployment import LocalDeployment
from tests.agent.support import (
    SESSION,
    agent_get,
    folded,
    of_kind,
    post,
    wait_answered,
)

TURNS = 150


def _bytes_of_turn(entries: list[JournalEntry], turn: int, kind: str | None = None) -> int:
    """What the owner journaled for ``turn``: its outputs and its ack, as stored."""
    return sum(
        len(orjson.dumps(e.payload)) + len(e.id) + len(e.kind)
        for e in entries
        if e.epoch > 0 and e.payload.get("turn") == turn and kind in (None, e.kind)
    )


async def test_the_write_of_a_turn_stays_constant_as_the_session_grows(
    dep: LocalDeployment, tmp_path: Path
) -> None:
    await dep.create_session(SESSION, image="surfaces:1", instance="v1")
    async with dep.client() as client:
        seqs = [await post(client, f"say message number {n:04d}") for n in range(TURNS)]
        seqs += [await post(client, f"note {n:04d}") for n in range(20)]
        entries = await wait_answered(dep.admin, seqs, timeout_s=60)

    says, notes = seqs[:TURNS], seqs[TURNS:]
    # Turns whose seqs have as many digits (seqs are in ids and payloads): the same
    # change each turn, the same write, but for a reply's count ("said 31" / "said
    # 150"). Which turns have three-digit seqs depends on how the posts and the
    # agent's outputs interleaved; the first and the last of them are at least 49
    # turns apart (150 posts), so a state written whole would have grown by half.
    three_digits = [seq for seq in says if 100 <= seq < 1000]
    early, late = three_digits[0], three_digits[-1]
    assert says.index(late) - says.index(early) >= 49, says
    first, last = _bytes_of_turn(entries, early), _bytes_of_turn(entries, late)
    assert 0 <= last - first <= 1, (first, last)
    state_first = _bytes_of_turn(entries, early, EntryKind.STATE)
    state_last = _bytes_of_turn(entries, late, EntryKind.STATE)
    assert state_last == state_first, (state_first, state_last)
    assert _bytes_of_turn(entries, notes[-1]) == _bytes_of_turn(entries, notes[1])

    values = folded(entries).agent.values
    assert values["messages"] == [
        {"role": "user", "content": f"message number {n:04d}"} for n in range(TURNS)
    ]
    assert values["notes"] == [f"{n:04d}" for n in range(20)]
    # The owner's own state is the fold of the journal.
    state = load_state(await agent_get(dep, "v1", "/v1/state"))
    assert dump_state(state) == dump_state(folded(e for e in entries if e.seq <= state.watermark))


async def test_a_migration_to_another_image_keeps_the_state_grown_by_deltas(
    dep: LocalDeployment,
) -> None:
    await dep.create_session(SESSION, image="surfaces:1", instance="v1")
    async with dep.client() as client:
        before = [await post(client, f"say before {n}") for n in range(30)]
        await wait_answered(dep.admin, before)
        record = dep.plan(
            SESSION,
            source=InstanceRef(name="v1", image="surfaces:1"),
            target_image="surfaces:2",
            policy=MigrationPolicy(phase_timeout_s=20.0),
        )
        record = await dep.migrate(record)
        assert record.phase is Phase.SUCCEEDED, record.error
        target = record.spec.target.name
        after = [await post(client, f"say after {n}") for n in range(10)]
        entries = await wait_answered(dep.admin, after)

    # v2 read v1's state through its migration, then grew it by deltas of its own.
    state = load_state(await agent_get(dep, target, "/v1/state"))
    said = [f"before {n}" for n in range(30)] + [f"after {n}" for n in range(10)]
    messages = state.agent.values["messages"]
    assert isinstance(messages, list)
    assert [m["content"] for m in messages if isinstance(m, dict)] == said
    assert state.agent.schema_version == 2
    upto = [e for e in entries if e.seq <= state.watermark]
    assert dump_state(folded(upto)) == dump_state(state)
    # Each turn after the move wrote its message alone, not the conversation again.
    last_state = of_kind(upto, EntryKind.STATE)[-1]
    assert [op["op"] for op in last_state.payload["ops"]] == ["append"]
    assert last_state.payload["ops"][0]["items"] == [{"role": "user", "content": "after 9"}]
