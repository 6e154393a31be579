"""The reference agent's images: each version starts as the owner of a session on a
gateway container and answers; the version is chosen when the container starts.

The session goes v1 → v2 → v2 again, stop-and-recreate style (each owner stopped, the
epoch moved on, the next one started): the live move between these images is the
operator's to test (its kubelet fixture's container mode).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import JsonValue

from shadowpod.agent.identity import Identity
from shadowpod.api.models import CreateSession, OwnershipChange
from shadowpod.client.gateway import GatewayClient
from tests.image.docker import Container, Containers, Images, inspect_image
from tests.image.support import (
    GatewayContainer,
    loopback_address,
    shared_with_container,
    wait_ready,
)

pytestmark = pytest.mark.timeout(1500)  # the first test of a run builds the image

SESSION = "image-test"
REPLY_TIMEOUT_S = 30.0


class RunningAgent:
    def __init__(self, container: Container, url: str) -> None:
        self.container = container
        self.url = url

    async def status(self) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
            http.get(f"{self.url}/v1/status") as response,
        ):
            assert response.status == 200
            found: dict[str, Any] = await response.json()
            return found


@dataclass
class Owners:
    """Hands the session to one agent container after another, as an operator's pods
    would be started: identity files mounted read-only, the rest in the environment."""

    containers: Containers
    gateway: GatewayContainer
    control: GatewayClient
    directory: Path
    token: str
    epoch: int = 0

    async def hand_to(
        self, image: str, *, entrypoint: str | None = None, args: Sequence[str] = ()
    ) -> tuple[RunningAgent, dict[str, Any]]:
        """The next epoch's owner, started from ``image``, once ready; and its status."""
        epoch, instance = self.epoch + 1, f"a-{self.epoch + 1}"
        await self.control.set_ownership(
            SESSION, OwnershipChange(expect_epoch=self.epoch, epoch=epoch, owner=instance)
        )
        self.epoch = epoch
        identity = self.directory / instance
        Identity.write(
            identity, session=SESSION, instance=instance, gateway=self.gateway.url, token=self.token
        )
        host, port = loopback_address()
        container = await self.containers.run(
            image,
            args,
            entrypoint=entrypoint,
            env={
                "SHADOWPOD_IDENTITY_DIR": "/etc/shadowpod/identity",
                "SHADOWPOD_MODE": "owner",
                "SHADOWPOD_EPOCH": str(epoch),
                "SHADOWPOD_LISTEN": f"{host}:{port}",
            },
            mounts={shared_with_container(identity): "/etc/shadowpod/identity"},
        )
        agent = RunningAgent(container, f"http://{host}:{port}")
        await wait_ready(f"{agent.url}/readyz", container)
        status = await agent.status()
        assert (status["mode"], status["epoch"], status["instance"]) == ("owner", epoch, instance)
        return agent, status


async def ask(client: GatewayClient, content: str) -> dict[str, JsonValue]:
    """Post a message as a client; the reply's payload, once the owner gave it."""
    seq = (await client.post_message(SESSION, content)).seq
    after = seq
    deadline = asyncio.get_running_loop().time() + REPLY_TIMEOUT_S
    while asyncio.get_running_loop().time() < deadline:
        page = await client.events(SESSION, after=after, kinds=["message"], wait_s=2)
        for event in page.events:
            payload = event["payload"]
            assert isinstance(payload, dict)
            if payload.get("role") == "assistant" and payload.get("turn") == seq:
                return payload
        after = page.next_after
    raise AssertionError(f"no reply to {content!r} within {REPLY_TIMEOUT_S} s")


async def assert_labels_match(image: str, status: dict[str, Any]) -> None:
    """The image's labels say what the agent in it reports when it runs."""
    labels = (await inspect_image(image))["Config"]["Labels"]
    assert labels["dev.shadowpod.agent.name"] == status["agent"] == "refagent"
    assert labels["dev.shadowpod.agent.version"] == status["version"]
    assert labels["dev.shadowpod.agent.state-schema"] == str(status["state_schema"])
    assert labels["dev.shadowpod.agent.reads-state-schemas"] == ",".join(
        map(str, status["reads_state_schemas"])
    )
    both = json.loads(labels["dev.shadowpod.refagent.state-schemas"])
    assert both[status["version"]] == {
        "writes": status["state_schema"],
        "reads": status["reads_state_schemas"],
    }


async def test_each_version_serves_the_session_as_its_owner(
    images: Images, gateway: GatewayContainer, containers: Containers, tmp_path: Path
) -> None:
    async with (
        GatewayClient(gateway.url, gateway.control_token) as control,
        GatewayClient(gateway.url) as client,
    ):
        token = (await control.create_session(CreateSession(session=SESSION))).agent_token
        owners = Owners(containers, gateway, control, tmp_path, token)

        # v1, from shadowpod-refagent:v1 as it is.
        v1, status = await owners.hand_to(images.refagent[1])
        assert status["version"] == "1"
        await assert_labels_match(images.refagent[1], status)
        # Its background process runs in the container too (the read-only root is no
        # obstacle), and the first answers come from v1.
        assert [p["name"] for p in status["processes"]] == ["indexer"]
        reply = await ask(client, "my name is Ada")
        assert reply["content"] == "[v1] #1 nice to meet you (hi Ada)"
        assert reply["meta"] == {"version": "1", "instance": "a-1", "epoch": 1}
        # A pod's termination: SIGTERM; it finishes, drains the indexer, exits 0.
        assert await v1.container.stop() == 0

        # v2, from shadowpod-refagent:v2: it takes over from the journal and reads v1's
        # state (schema 1) into its own (schema 2).
        v2, status = await owners.hand_to(images.refagent[2])
        assert status["version"] == "2"
        await assert_labels_match(images.refagent[2], status)
        reply = await ask(client, "how are you")
        assert reply["content"] == "v2 > turn 2: how are you (hi Ada)"
        assert await v2.container.stop() == 0

        # The version chosen when the container starts: the main image, its refagent
        # entrypoint told --version 2.
        v2_again, status = await owners.hand_to(
            images.shadowpod, entrypoint="refagent", args=["--version", "2"]
        )
        assert status["version"] == "2"
        reply = await ask(client, "still there?")
        assert reply["content"] == "v2 > turn 3: still there? (hi Ada)"
        assert await v2_again.container.stop() == 0


async def test_refagent_without_a_version_says_how_to_choose_one(
    images: Images, containers: Containers
) -> None:
    code, output = await containers.run_to_end(images.shadowpod, entrypoint="refagent")
    assert code == 2
    assert "--version" in output
    assert "Traceback" not in output
