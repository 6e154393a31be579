"""The crash campaign (``shadowpod bench chaos``), short: one migration per victim kind,
each killed with SIGKILL at a phase boundary, and the invariants after every one."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from shadowpod.bench.chaos import (
    INVARIANTS,
    PHASES,
    VICTIMS,
    ChaosConfig,
    Strike,
    broken_invariants,
    plan_strikes,
    run_chaos,
)
from shadowpod.client.gateway import GatewayClient
from shadowpod.engine.record import Phase
from shadowpod.local.checks import Check
from shadowpod.local.load import ClientLoad, Reply, Sent
from shadowpod.local.orphans import TAG_ENV, still_running

# Seed 23 strikes, at the boundary each: the shadow at Committed (a new owner that
# crashed after the bump: restarted by the engine), the gateway at Restoring, the
# engine at Snapshotting (a new engine resumes), the source at Preflight (the target
# takes over from the journal; nothing outside the engine restarts anything).
SEED = 23


def test_every_four_strikes_hit_every_victim_where_it_exists() -> None:
    strikes = plan_strikes(40, seed=7)
    for block in range(0, 40, 4):
        assert sorted(s.victim for s in strikes[block : block + 4]) == sorted(VICTIMS)
    for strike in strikes:
        assert strike.phase in PHASES[strike.victim]
        # Before Restoring acts there is no shadow to kill at the boundary.
        assert not (
            strike.victim == "shadow" and strike.phase is Phase.RESTORING and not strike.delay_s
        )
    assert plan_strikes(40, seed=7) == strikes  # a seed gives the same campaign
    assert plan_strikes(40, seed=8) != strikes


async def test_a_short_crash_campaign_loses_doubles_reorders_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    config = ChaosConfig(
        migrations=4, seed=SEED, rate=20.0, warmup_s=0.5, gap_s=0.1, workdir=tmp_path,
        loop_steps=100_000,
    )  # fmt: skip
    report = await run_chaos(config)
    struck = [(m["victim"], m["phase"], m["delay_ms"], m["hit"]) for m in report["migrations"]]
    assert struck == [
        ("shadow", "Committed", 0, True),
        ("gateway", "Restoring", 0, True),
        ("engine", "Snapshotting", 0, True),
        ("source", "Preflight", 0, True),
    ]
    _held(report)
    by_victim = {m["victim"]: m for m in report["migrations"]}
    # Each crash was recovered the way it should be.
    assert by_victim["shadow"]["result"] == "Succeeded"
    assert by_victim["shadow"]["recoveries"] == 1
    assert by_victim["engine"]["result"] == "Succeeded"
    assert by_victim["engine"]["engine_restarts"] == 1
    assert by_victim["gateway"]["result"] == "Succeeded"
    assert by_victim["source"]["result"] == "Succeeded"  # not rolled back to a dead owner
    assert by_victim["source"]["source_lost"] == "Snapshotting"
    assert await asyncio.to_thread(os.listdir, tmp_path) == []  # its working directory is gone


def _held(report: dict[str, Any]) -> None:
    """Every invariant of the campaign held (see ``INVARIANTS``)."""
    broken = report["targets"]["invariants"]
    assert broken["met"], (broken["measured"], report["migrations"])
    assert (report["lost"], report["duplicated"], report["reordered"]) == (0, 0, 0)
    assert (report["late"], report["dead_owners"]) == (0, 0)
    assert report["worst_answer_s"] <= report["answer_bound_s"]
    assert (report["orphans"], report["leftovers"]) == (0, 0)
    assert report["messages"]["answered"] == report["messages"]["accepted"] > 0


@pytest.mark.parametrize("victim", VICTIMS)
async def test_a_kill_at_every_phase_boundary_loses_nothing_and_leaves_no_dead_owner(
    tmp_path: Path, victim: str
) -> None:
    """``victim`` killed at each phase boundary where it exists, one migration each
    (the engine held at the boundary by its own record's save, before the phase acts):
    every message answered within the campaign's bound, no session left ownerless."""
    strikes = tuple(
        Strike(victim, phase, 0.0)
        for phase in PHASES[victim]
        if not (victim == "shadow" and phase is Phase.RESTORING)  # not started there yet
    )
    config = ChaosConfig(
        strikes=strikes, seed=SEED, rate=20.0, warmup_s=0.5, gap_s=0.1, workdir=tmp_path,
        loop_steps=100_000,
    )  # fmt: skip
    report = await run_chaos(config)
    struck = [(m["phase"], m["struck_in"]) for m in report["migrations"]]
    assert struck == [(s.phase.value, s.phase.value) for s in strikes]
    # Each one hit a running victim — but a source after the bump, which may have
    # drained and exited by itself already.
    missed = [m["phase"] for m in report["migrations"] if not m["hit"]]
    assert set(missed) <= ({"Committed", "Draining"} if victim == "source" else set())
    _held(report)
    results = {m["phase"]: m["result"] for m in report["migrations"]}
    if victim in ("gateway", "engine"):
        assert set(results.values()) == {"Succeeded"}, report["migrations"]
    elif victim == "source":  # every strike before the bump: the target takes over
        assert set(results.values()) == {"Succeeded"}, report["migrations"]
        lost_in = {m["phase"]: m["source_lost"] for m in report["migrations"]}
        assert all(lost_in[p.value] is not None for p in PHASES["source"][:5])
    else:  # the shadow: rolled back before the bump, restarted as the owner after it
        assert results["CatchingUp"] == results["Fencing"] == "RolledBack"
        assert results["Committed"] == results["Draining"] == "Succeeded"


def test_a_process_left_in_a_dead_instance_s_group_or_with_its_tag_is_found() -> None:
    tag = uuid.uuid4().hex
    # A leader that starts a child in its group and one in a group of its own, then dies.
    script = (
        "import subprocess, sys, time\n"
        "a = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "b = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        "print(a.pid, b.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, TAG_ENV: tag},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert leader.stdout is not None
    children = [int(pid) for pid in leader.stdout.readline().split()]
    try:
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()
        found = still_running(tag, leader.pid)
        assert sorted(p.pid for p in found) == sorted(children)
        assert still_running(uuid.uuid4().hex, 1 << 22) == []
    finally:
        leader.stdout.close()
        for pid in children:
            os.kill(pid, signal.SIGKILL)


def test_a_campaign_fails_on_any_count_or_failed_check_but_not_on_a_rollback() -> None:
    clean = dict.fromkeys(INVARIANTS, 0)
    rolled_back = Check("migrations succeeded", False, "3 of 4 succeeded")
    drained = Check("sources drained", True, "4 of 4")
    assert broken_invariants(clean, [rolled_back, drained]) == []
    for name in INVARIANTS:
        assert broken_invariants({**clean, name: 1}, [drained]) == [name]
    late = Check("no write of a fenced epoch after its fence", False, "1 write")
    assert broken_invariants(clean, [rolled_back, late]) == [late.name]


async def test_a_lost_message_is_not_waited_for_while_newer_ones_are_answered() -> None:
    load = ClientLoad(GatewayClient("http://127.0.0.1:9"), "s", rate=10)
    load.sent.append(Sent(n=0, id="lost", at=time.monotonic(), seq=1))  # never answered
    cutoff = time.monotonic()

    async def newer_answered() -> None:
        for n in range(1, 1000):
            load.sent.append(Sent(n=n, id=f"m{n}", at=time.monotonic(), seq=n + 1))
            load.replies[n + 1] = [Reply(n + 1, n + 1000, "ok", "1", time.monotonic())]
            load.reply_order.append(n + 1)
            await asyncio.sleep(0.02)

    answering = asyncio.create_task(newer_answered())
    try:
        assert not await asyncio.wait_for(load.wait_answered(0.3, sent_before=cutoff), 5.0)
    finally:
        answering.cancel()
    assert [s.id for s in load.unanswered(cutoff)] == ["lost"]
