"""LangGraph's own checkpointer conformance suite (``langgraph-checkpoint-conformance``)
against ``ShadowpodSaver``: every capability, base and extended (put, put_writes,
get_tuple, list, delete_thread, delete_for_runs, copy_thread, prune).

Run twice: outside any agent process, on a state in memory (``ShadowpodSaver(values=
{})``: how a test or an admin uses it), and inside a turn of an owner whose outputs
go to a real SQLite journal store, where the suite's hundreds of threads end up in the
turn's one state entry and fold back to what the owner holds."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from shadowpod.bench.inprocess import InProcessOwner
from shadowpod.domain.ownership import Ownership
from shadowpod.integrations.langgraph import ShadowpodSaver
from shadowpod.journal.sqlite.store import SQLiteJournalStore

SESSION = "conformance"


def _failures(report: Any) -> dict[str, list[str]]:
    assert all(result.tests_passed > 0 for result in report.results.values()), report
    return {
        name: result.failures
        for name, result in report.results.items()
        if result.passed is not True or not result.detected
    }


async def test_the_saver_on_a_state_in_memory_passes_langgraph_conformance_suite() -> None:
    savers: list[ShadowpodSaver] = []

    @checkpointer_test(name="ShadowpodSaver (in memory)")
    async def in_memory() -> AsyncGenerator[ShadowpodSaver, None]:
        saver = ShadowpodSaver(values={})
        savers.append(saver)
        yield saver

    report = await validate(in_memory)
    assert set(report.results) == {c.value for c in ALL_CAPABILITIES}
    assert _failures(report) == {}
    assert report.conformance_level() == "FULL"
    # Several threads per saver (one session), all written into its state.
    assert max(len(saver.values.get("langgraph", {})) for saver in savers) > 1


@pytest.fixture
async def owner(tmp_path: Path) -> AsyncIterator[InProcessOwner]:
    store = SQLiteJournalStore(tmp_path / "journal.db")
    await store.open()
    try:
        await store.create_session(SESSION)
        await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="test"))
        yield InProcessOwner(store, SESSION)
    finally:
        await store.close()


async def test_the_saver_in_a_turn_passes_the_suite_and_the_journal_folds_to_it(
    owner: InProcessOwner,
) -> None:
    held: list[dict[str, Any]] = []

    @checkpointer_test(name="ShadowpodSaver (in a turn)")
    async def in_a_turn() -> AsyncGenerator[ShadowpodSaver, None]:
        saver = ShadowpodSaver()
        seq, turn = await owner.open_turn("(the conformance suite)")
        with saver.bound(turn):
            yield saver
        held.append(dict(turn.values))
        await owner.close_turn(seq, turn)

    report = await validate(in_a_turn)
    assert _failures(report) == {}
    assert report.conformance_level() == "FULL"
    # What each turn held is what its state entry folded to: the journal alone has it.
    folded = owner.folder.peek().agent.values
    assert orjson.dumps(folded, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        held[-1], option=orjson.OPT_SORT_KEYS
    )
    assert len(held) == len(ALL_CAPABILITIES)
