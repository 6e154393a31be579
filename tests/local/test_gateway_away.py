"""An instance that starts while the gateway is away (killed, restarting) waits for it.

Found by the crash campaign: a shadow started just as the gateway was killed exited
with code 1 on its first connection error, and the migration rolled back; an owner
restarted then (after a crash, by its pod) would fail the migration after the bump.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shadowpod.engine.ports import InstanceSpec
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images


@pytest.mark.parametrize("mode", ["shadow", "owner"])
async def test_an_instance_started_while_the_gateway_is_down_serves_once_it_is_back(
    tmp_path: Path, mode: str
) -> None:
    async with LocalDeployment(tmp_path, reference_images()) as dep:
        await dep.create_session("s", image="refagent:v1", instance="s-v1")
        if mode == "owner":  # the owner crashed; its pod starts it again
            await dep.runtime.kill("s-v1")
        name = "s-v1" if mode == "owner" else "s-shadow"
        await dep.gateway.stop(kill=True)
        await dep.runtime.start(
            InstanceSpec(
                name=name,
                image="refagent:v1",
                session="s",
                mode="owner" if mode == "owner" else "shadow",
                epoch=1 if mode == "owner" else None,
            )
        )
        await asyncio.sleep(2.0)  # a gateway restart takes about as long
        status = await dep.runtime.status(name)
        assert status.alive, status.error
        assert not status.ready  # it has no state yet: it says so
        await dep.gateway.start()
        if mode == "owner":
            await dep.wait_serving(name)
        else:
            deadline = asyncio.get_running_loop().time() + 30.0
            while not (status := await dep.runtime.status(name)).ready:
                assert status.alive, status.error
                assert asyncio.get_running_loop().time() < deadline, "never ready"
                await asyncio.sleep(0.05)
            assert status.mode == "shadow"
