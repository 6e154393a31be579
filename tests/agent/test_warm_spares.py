"""Warm spares: the local runtime's pre-started agent process becomes the next
instance of its image (see ``shadowpod.local.runtime``), and a dead one is replaced
by a cold start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from shadowpod.api.models import OwnershipChange
from shadowpod.engine.ports import InstanceSpec
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.runtime import WarmSpare
from tests.agent.support import (
    SESSION,
    agent_images,
    alive,
    lines_of,
    post,
    replies_to,
    wait_answered,
    wait_for,
)

IMAGE = "surfaces:1"
REFAGENT = Path(__file__).parents[2] / "examples" / "01-reference-agent" / "refagent.py"


async def _hand_over(dep: LocalDeployment) -> WarmSpare:
    """The first owner stops, "b" owns epoch 2; returns the spare made once "a" exited."""
    await dep.admin.set_ownership(SESSION, OwnershipChange(expect_epoch=1, epoch=2, owner="b"))
    await dep.runtime.stop("a", grace_s=5)

    async def made() -> WarmSpare | None:
        return dep.runtime.spare(IMAGE)

    return await wait_for(made, "the spare made once the instance exited")


async def test_the_spare_becomes_the_next_instance_and_serves(tmp_path: Path) -> None:
    async with (
        LocalDeployment(tmp_path, agent_images(tmp_path), warm_spares=True) as dep,
        dep.client() as client,
    ):
        await dep.create_session(SESSION, image=IMAGE, instance="a")
        await wait_answered(dep.admin, [await post(client, "hello")])
        assert dep.runtime.spare(IMAGE) is None  # none until an instance stops
        spare = await _hand_over(dep)
        assert alive(spare.process.pid)

        await dep.runtime.start(
            InstanceSpec(name="b", image=IMAGE, session=SESSION, mode="owner", epoch=2)
        )
        b = dep.runtime.instance("b")
        assert b is not None
        assert b.process.pid == spare.process.pid  # no new process: the spare is b
        await dep.wait_serving("b")
        last = await post(client, "again")
        (reply,) = replies_to(await wait_answered(dep.admin, [last]), last)
        assert reply.epoch == 2
        # Its log is the instance's, where an operator looks for it.
        assert b.log == tmp_path / "instances" / "b" / "agent.log"
        assert any("serving as owner" in line for line in lines_of(b.log))
    assert not alive(spare.process.pid)


async def test_a_dead_spare_is_replaced_by_a_cold_start(tmp_path: Path) -> None:
    async with (
        LocalDeployment(tmp_path, agent_images(tmp_path), warm_spares=True) as dep,
        dep.client() as client,
    ):
        await dep.create_session(SESSION, image=IMAGE, instance="a")
        spare = await _hand_over(dep)
        os.kill(spare.process.pid, signal.SIGKILL)
        await spare.process.wait()

        await dep.runtime.start(
            InstanceSpec(name="b", image=IMAGE, session=SESSION, mode="owner", epoch=2)
        )
        b = dep.runtime.instance("b")
        assert b is not None and b.process.pid != spare.process.pid
        await dep.wait_serving("b")
        last = await post(client, "still served")
        (reply,) = replies_to(await wait_answered(dep.admin, [last]), last)
        assert reply.epoch == 2


async def test_an_unused_spare_exits_cleanly_when_the_runtime_closes(tmp_path: Path) -> None:
    async with LocalDeployment(tmp_path, agent_images(tmp_path), warm_spares=True) as dep:
        await dep.create_session(SESSION, image=IMAGE, instance="a")
        spare = await _hand_over(dep)
        assert spare.process.returncode is None  # it waits to be needed
    assert spare.process.returncode == 0  # told it is not needed, it left on its own
    assert dep.runtime.spare(IMAGE) is None


def test_a_warm_process_told_nonsense_says_so_and_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, str(REFAGENT), "--version", "1"],
        input="not json\n",
        env={**os.environ, "SHADOWPOD_WARM": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "expects one JSON object of strings on stdin" in result.stderr, result.stderr
