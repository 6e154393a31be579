"""Each invariant of a live scenario, judged on runs built by hand: it fails when its
property fails, and only then (a run with nothing to judge it by says so)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from shadowpod.client.gateway import GatewayClient
from shadowpod.engine.record import (
    FenceInfo,
    InstanceRef,
    MigrationRecord,
    MigrationSpec,
    Phase,
)
from shadowpod.local.checks import Check, session_checks
from shadowpod.local.load import ClientLoad, Reply, Sent
from shadowpod.local.scenario import MigrationOutcome
from tests.domain.builders import JournalBuilder

NAME = "Ada"


def _load(replies: list[tuple[int, str]], *, unaccepted: int = 0) -> ClientLoad:
    """Messages 1..n, each answered in the order of ``replies`` (turn, version)."""
    load = ClientLoad(GatewayClient("http://127.0.0.1:9"), "s", rate=10)
    turns = sorted({turn for turn, _ in replies})
    for turn in turns:
        sent = Sent(n=turn, id=f"m{turn}", at=float(turn), seq=turn)
        load.sent.append(sent)
        load.by_seq[turn] = sent
    for n in range(unaccepted):  # the gateway never answered these
        load.sent.append(Sent(n=100 + n, id=f"gone{n}", at=50.0))
    for at, (turn, version) in enumerate(replies, start=1):
        content = f"v{version} > turn {turn}" + (f" (hi {NAME})" if version != "1" else "")
        reply = Reply(turn=turn, seq=1000 + at, content=content, version=version, at=turn + 0.1)
        load.replies.setdefault(turn, []).append(reply)
        load.reply_order.append(turn)
    return load


def _migration(
    phase: Phase = Phase.SUCCEEDED,
    *,
    moved: bool = True,
    source_exit: int | None = 0,
) -> MigrationOutcome:
    spec = MigrationSpec(
        id="m-1",
        session="s",
        source=InstanceRef(name="s-v1", image="refagent:v1"),
        target=InstanceRef(name="s-1", image="refagent:v2"),
    )
    fence = FenceInfo(epoch=2, fence_seq=10, waited_ms=1.0, attempts=1) if moved else None
    record = MigrationRecord(spec=spec, phase=phase, source_epoch=1, fence=fence)
    outcome = MigrationOutcome(record=record, started=0.0, ended=1.0, client_max_latency_ms=0.0)
    outcome.source_exit = source_exit
    return outcome


def _check(checks: list[Check], name: str) -> Check:
    [found] = [c for c in checks if c.name == name]
    return found


def test_no_reply_from_a_new_version_yet_is_not_a_memory_failure() -> None:
    # The migration ended just before the run did: only v1 answered.
    load = _load([(1, "1"), (2, "1")])
    journal = JournalBuilder()
    journal.add("control", epoch=1, event="drained", owner="s-v1")
    checks = session_checks([_migration()], load, journal.entries, name=NAME)
    memory = _check(checks, "new versions answer with v1's memory")
    assert memory.ok and not memory.measured
    assert "no reply came from a version after v1" in memory.detail


def test_a_new_version_that_forgot_the_name_fails_the_memory_check() -> None:
    load = _load([(1, "1"), (2, "2")])
    load.replies[2][0].content = "v2 > turn 2"  # no greeting: v1's memory is gone
    checks = session_checks([_migration()], load, [], name=NAME)
    memory = _check(checks, "new versions answer with v1's memory")
    assert not memory.ok and memory.measured


def test_a_migration_that_failed_after_moving_the_owner_explains_its_version_switch() -> None:
    # Failed after the epoch bump: the target owns the session and answers.
    load = _load([(1, "1"), (2, "2"), (3, "2")])
    checks = session_checks([_migration(Phase.FAILED)], load, [], name=NAME)
    assert _check(checks, "one version per reply").ok
    assert not _check(checks, "migrations succeeded").ok  # that one did fail


def test_a_version_switch_with_no_owner_change_is_caught() -> None:
    load = _load([(1, "1"), (2, "2"), (3, "1")])
    checks = session_checks([_migration()], load, [], name=NAME)
    assert not _check(checks, "one version per reply").ok


def test_a_message_answered_twice_is_a_duplicate_not_also_a_reorder() -> None:
    load = _load([(1, "1"), (2, "1"), (1, "1"), (3, "1")])
    checks = session_checks([], load, [], name=NAME)
    assert not _check(checks, "duplicated").ok
    reordered = _check(checks, "reordered")
    assert reordered.ok, reordered.detail


def test_replies_out_of_order_are_caught() -> None:
    load = _load([(1, "1"), (3, "1"), (2, "1")])
    checks = session_checks([], load, [], name=NAME)
    assert not _check(checks, "reordered").ok


def test_a_message_the_gateway_never_accepted_is_not_counted_lost() -> None:
    load = _load([(1, "1"), (2, "1")], unaccepted=3)
    lost = _check(session_checks([], load, [], name=NAME), "lost")
    assert lost.ok, lost.detail
    assert "3 never accepted" in lost.detail


def test_an_accepted_message_without_a_reply_is_lost() -> None:
    load = _load([(1, "1")])
    load.sent.append(Sent(n=2, id="m2", at=2.0, seq=2))
    lost = _check(session_checks([], load, [], name=NAME), "lost")
    assert not lost.ok and "1 of 2 accepted messages got no reply" in lost.detail


@pytest.fixture
def background() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing for a source's background work that outlived it."""
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    process = subprocess.Popen(command)
    yield process
    process.kill()
    process.wait()


def test_a_killed_source_whose_background_work_died_with_it_is_not_a_drain_failure() -> None:
    # SIGKILL, so no drain report; the process it started is gone (pid 1 never runs it).
    journal = JournalBuilder()
    journal.add("process", epoch=1, name="indexer", op="started", pid=1, command=["indexer"])
    drained = _check(
        session_checks([_migration(source_exit=-9)], _load([]), journal.entries, name=NAME),
        "sources drained",
    )
    assert drained.ok, drained.detail
    assert "exit code -9" in drained.detail


@pytest.mark.parametrize("reported", [False, True], ids=["killed", "reported-its-drain"])
def test_a_source_that_left_its_background_process_running_fails_the_drain_check(
    background: subprocess.Popen[bytes], reported: bool
) -> None:
    journal = JournalBuilder()
    journal.add(
        "process",
        epoch=1,
        name="indexer",
        op="started",
        pid=background.pid,
        command=background.args,
    )
    if reported:
        journal.add("control", epoch=1, event="drained", owner="s-v1")
    outcome = _migration(source_exit=0 if reported else -9)
    drained = _check(
        session_checks([outcome], _load([]), journal.entries, name=NAME), "sources drained"
    )
    assert not drained.ok
    assert f"indexer (pid {background.pid}) running" in drained.detail


def test_a_source_still_running_without_a_drain_report_fails_the_drain_check() -> None:
    drained = _check(
        session_checks([_migration(source_exit=None)], _load([]), [], name=NAME),
        "sources drained",
    )
    assert not drained.ok and "still running" in drained.detail


def test_a_recovered_migration_is_not_compared_and_says_why() -> None:
    outcome = _migration()
    outcome.record = outcome.record.model_copy(update={"recoveries": 1})
    state = _check(
        session_checks([outcome], _load([]), [], name=NAME),
        "state at fence_seq equals the source's",
    )
    assert state.ok and not state.measured
    assert "restarted after the cutover" in state.detail


def test_a_promoted_state_that_differs_from_the_fold_fails() -> None:
    outcome = _migration()
    outcome.state_matches = False
    state = _check(
        session_checks([outcome], _load([]), [], name=NAME),
        "state at fence_seq equals the source's",
    )
    assert not state.ok and state.measured


def _moved_journal() -> JournalBuilder:
    journal = JournalBuilder()
    journal.add("control", epoch=1, event="epoch", owner="s-v1")
    first = journal.inbound("hello")
    journal.reply("hi", turn=first, epoch=1)
    journal.add("control", epoch=2, event="epoch", owner="s-1")
    return journal


def test_a_write_of_a_replaced_owner_after_its_fence_is_caught() -> None:
    journal = _moved_journal()
    late = journal.inbound("again")
    journal.reply("stale", turn=late, epoch=1)  # the fenced owner still wrote
    fenced = _check(
        session_checks([_migration()], _load([]), journal.entries, name=NAME),
        "no write of a fenced epoch after its fence",
    )
    assert not fenced.ok and "seq 6 (message) at epoch 1 of 2" in fenced.detail


def test_writes_of_the_new_owner_and_inbound_after_the_fence_are_fine() -> None:
    journal = _moved_journal()
    after = journal.inbound("again")
    journal.reply("fresh", turn=after, epoch=2)
    journal.add("control", event="drained", owner="s-v1")  # journaled by the gateway
    fenced = _check(
        session_checks([_migration()], _load([]), journal.entries, name=NAME),
        "no write of a fenced epoch after its fence",
    )
    assert fenced.ok and fenced.measured, fenced.detail
