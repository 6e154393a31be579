"""The reducer folds a journal into the seven surfaces, in processing order."""

from __future__ import annotations

from shadowpod.domain.payloads import MAX_SCHEDULES_PER_SESSION
from shadowpod.domain.reducer import StateFolder, apply, fold
from shadowpod.domain.state import CallStatus, ProcessStatus, SessionState
from tests.domain.builders import START, JournalBuilder


def _transcript(state: SessionState) -> list[tuple[str, str]]:
    return [(m.role.value, m.content) for m in state.transcript]


def test_the_transcript_follows_processing_order_not_arrival_order() -> None:
    # DESIGN.md §3 rule 6: 10 in(m1), 11 in(m2) mid-turn, 12 out(r1), 13 ack(10),
    # 14 out(r2), 15 ack(11) folds to m1, r1, m2, r2.
    j = JournalBuilder()
    m1 = j.inbound("m1")
    m2 = j.inbound("m2")
    j.reply("r1", turn=m1)
    j.ack(m1)
    j.reply("r2", turn=m2)
    j.ack(m2)
    state = fold(SessionState(), j.entries)
    assert _transcript(state) == [
        ("user", "m1"),
        ("assistant", "r1"),
        ("user", "m2"),
        ("assistant", "r2"),
    ]
    assert state.acked_turn == m2
    assert state.pending == {}


def test_inbound_after_the_last_acked_turn_is_pending_for_the_next_owner() -> None:
    j = JournalBuilder()
    m1 = j.inbound("m1")
    j.reply("r1", turn=m1)
    j.ack(m1)
    m2 = j.inbound("m2")
    m3 = j.inbound("m3")
    state = fold(SessionState(), j.entries)
    assert list(state.pending) == [m2, m3]
    assert [p.content for p in state.pending.values()] == ["m2", "m3"]
    assert _transcript(state) == [("user", "m1"), ("assistant", "r1")]


def test_a_turn_starts_with_its_first_output_and_stays_pending_until_its_ack() -> None:
    j = JournalBuilder()
    m1 = j.inbound("m1")
    j.add("tool_call", epoch=1, call_id="c1", tool="search", args={"q": "x"}, turn=m1)
    state = fold(SessionState(), j.entries)
    assert _transcript(state) == [("user", "m1")]
    # Started but not acked: the next owner must redo it (and must not add m1 again).
    assert state.pending[m1].started
    assert state.acked_turn == 0
    j.reply("r1", turn=m1, epoch=2)
    j.ack(m1, epoch=2)
    state = fold(state, j.entries[-2:])
    assert _transcript(state) == [("user", "m1"), ("assistant", "r1")]
    assert state.pending == {}


def test_the_tool_ledger_knows_uncertain_side_effects_and_idempotent_tools() -> None:
    j = JournalBuilder()
    m1 = j.inbound("pay and look up")
    j.add("tool_call", epoch=1, call_id="pay", tool="charge_card", args={"eur": 5}, turn=m1)
    j.add("tool_call", epoch=1, call_id="look", tool="search", idempotent=True, turn=m1)
    j.add("tool_result", epoch=1, call_id="look", result={"hits": 3}, turn=m1)
    state = fold(SessionState(), j.entries)
    assert [c.call_id for c in state.tools.uncertain()] == ["pay"]
    assert state.tools.is_idempotent("search")
    assert not state.tools.is_idempotent("charge_card")
    assert not state.tools.is_idempotent("never_seen")
    assert state.tools.calls["look"].status is CallStatus.OK
    assert state.tools.calls["look"].result == {"hits": 3}

    j.add("tool_result", epoch=2, call_id="pay", status="abandoned", error="outcome unknown")
    state = fold(state, j.entries[-1:])
    assert state.tools.uncertain() == []
    assert state.tools.calls["pay"].status is CallStatus.ABANDONED


def test_a_result_without_an_intent_is_kept_visible() -> None:
    j = JournalBuilder()
    j.add("tool_result", epoch=1, call_id="orphan", status="error", error="boom")
    state = fold(SessionState(), j.entries)
    assert state.tools.calls["orphan"].status is CallStatus.ERROR
    assert state.tools.calls["orphan"].tool == ""


def test_memory_facts_credentials_processes_and_agent_state() -> None:
    j = JournalBuilder()
    j.add("memory", epoch=1, key="city", value="Oslo")
    j.add("memory", epoch=1, key="tmp", value=1)
    j.add("memory", epoch=1, key="tmp", op="delete")
    j.add("fact", epoch=1, fact_id="f1", text="never deploy on Fridays")
    j.add("fact", epoch=1, fact_id="f2", text="wrong")
    j.add("fact", epoch=1, fact_id="f2", op="retract")
    j.add("credential", name="openai", secret_ref="agent-keys/openai")
    j.add("credential", name="old", secret_ref="x/y")
    j.add("credential", name="old", op="unbind")
    j.add("process", epoch=1, name="indexer", op="started", command=["idx", "--all"], pid=42)
    j.add("process", epoch=1, name="indexer", op="terminated", exit_code=-15)
    j.add("state", epoch=1, values={"plan": ["a"], "step": 1}, schema_version=2)
    j.add("state", epoch=1, values={"step": 2})
    state = fold(SessionState(), j.entries)
    assert state.memory == {"city": "Oslo"}
    assert {f.fact_id: f.text for f in state.facts.values()} == {"f1": "never deploy on Fridays"}
    assert state.facts["f1"].seq == 4
    assert list(state.credentials) == ["openai"]
    assert state.credentials["openai"].secret_ref == "agent-keys/openai"
    indexer = state.processes["indexer"]
    assert (indexer.status, indexer.exit_code, indexer.pid) == (ProcessStatus.TERMINATED, -15, 42)
    assert state.agent.values == {"plan": ["a"], "step": 2}
    assert state.agent.schema_version == 1  # the last state entry declared the default

    j.add("state", epoch=1, values={"only": True}, replace=True, schema_version=3)
    state = fold(state, j.entries[-1:])
    assert state.agent.values == {"only": True}
    assert state.agent.schema_version == 3


def test_schedules_are_set_fired_and_cancelled() -> None:
    j = JournalBuilder()
    set_seq = j.add(
        "schedule", epoch=1, schedule_id="digest", op="set", every_s=60, content="send digest"
    ).seq
    fire = j.add(
        "schedule",
        id="schedule:digest:1",
        schedule_id="digest",
        op="fire",
        fire_no=1,
        content="send digest",
    ).seq
    state = fold(SessionState(), j.entries)
    digest = state.schedules["digest"]
    assert (digest.every_s, digest.fired, digest.last_fire_seq, digest.set_seq) == (
        60,
        1,
        fire,
        set_seq,
    )
    assert digest.anchor == START.replace(second=set_seq)
    assert state.pending[fire].schedule_id == "digest"  # a fire is work for the owner
    j.add("schedule", epoch=1, schedule_id="digest", op="cancel")
    assert fold(state, j.entries[-1:]).schedules == {}


def test_a_session_keeps_at_most_its_bound_of_schedules() -> None:
    j = JournalBuilder()
    for n in range(MAX_SCHEDULES_PER_SESSION + 3):
        j.add("schedule", epoch=1, schedule_id=f"s{n}", op="set", every_s=60)
    state = fold(SessionState(), j.entries)
    assert sorted(state.schedules) == sorted(f"s{n}" for n in range(MAX_SCHEDULES_PER_SESSION))
    # The sets beyond the bound are kept, visibly, not applied.
    assert [e.payload["schedule_id"] for e in state.extensions] == [
        f"s{n}" for n in range(MAX_SCHEDULES_PER_SESSION, MAX_SCHEDULES_PER_SESSION + 3)
    ]
    assert all("cancel one first" in (e.error or "") for e in state.extensions)
    # Changing one that exists is not a new one; cancelling one makes room.
    j.add("schedule", epoch=1, schedule_id="s0", op="set", every_s=120)
    j.add("schedule", epoch=1, schedule_id="s1", op="cancel")
    j.add("schedule", epoch=1, schedule_id="late", op="set", every_s=60)
    state = fold(state, j.entries[-3:])
    assert state.schedules["s0"].every_s == 120
    assert "late" in state.schedules and "s1" not in state.schedules
    assert len(state.schedules) == MAX_SCHEDULES_PER_SESSION


def test_epoch_changes_are_reflected() -> None:
    j = JournalBuilder()
    j.add("control", {"event": "epoch", "epoch": 2, "owner": "pod-b"}, epoch=2)
    assert fold(SessionState(), j.entries).epoch == 2


def test_unknown_kinds_and_unparseable_payloads_go_to_extensions_never_dropped() -> None:
    j = JournalBuilder()
    j.add("x.vendor_note", epoch=1, anything=[1, 2])
    state = fold(SessionState(), j.entries)
    # A payload written by a newer version that this reducer cannot parse:
    from dataclasses import replace

    odd = replace(j.entries[0], seq=2, kind="memory", payload={"key": "k", "shape": "v9"})
    state = apply(state, odd)
    assert [(e.seq, e.kind, e.error is None) for e in state.extensions] == [
        (1, "x.vendor_note", True),
        (2, "memory", False),
    ]
    assert state.extensions[1].error is not None and "shape" in state.extensions[1].error
    assert state.watermark == 2


def test_apply_is_pure_and_entries_at_or_below_the_watermark_are_skipped() -> None:
    j = JournalBuilder()
    m1 = j.inbound("m1")
    j.reply("r1", turn=m1)
    before = fold(SessionState(), j.entries[:1])
    snapshot = before.model_dump()
    after = apply(before, j.entries[1])
    assert before.model_dump() == snapshot
    assert len(after.transcript) == 2
    assert apply(after, j.entries[0]) == after  # already reflected


def test_a_folder_keeps_applying_and_hands_out_independent_views() -> None:
    j = JournalBuilder()
    folder = StateFolder(SessionState())
    folder.apply(j.add("memory", epoch=1, key="a", value=1))
    view = folder.view()
    folder.apply(j.add("memory", epoch=1, key="b", value=2))
    assert view.memory == {"a": 1}
    assert folder.watermark == 2
    assert folder.release().memory == {"a": 1, "b": 2}
