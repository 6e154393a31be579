"""The gateway entrypoint, in a hardened container of the image."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from shadowpod.api.models import CreateSession
from shadowpod.client.gateway import GatewayClient
from tests.image.docker import Containers, Images
from tests.image.support import GatewayContainer

pytestmark = pytest.mark.timeout(1500)  # the first test of a run builds the image


async def test_gateway_answers_readyz_and_keeps_its_journal_on_the_volume(
    gateway: GatewayContainer,
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.url}/readyz") as ready:
            assert ready.status == 200
        async with http.get(f"{gateway.url}/metrics") as metrics:
            assert metrics.status == 200
            assert "shadowpod_" in await metrics.text()
    async with GatewayClient(gateway.url, gateway.control_token) as control:
        await control.create_session(CreateSession(session="on-the-volume"))
        await control.post_message("on-the-volume", "hello")
    # The root filesystem is read-only: the journal can only be where the volume is.
    assert (gateway.journal_dir / "journal.db").stat().st_size > 0


async def test_gateway_stops_cleanly_on_sigterm(gateway: GatewayContainer) -> None:
    # A pod's termination: SIGTERM to PID 1, which is the gateway itself.
    assert await gateway.container.stop(grace_s=20) == 0


async def test_gateway_started_wrong_says_what_is_missing(
    images: Images, containers: Containers, tmp_path: Path
) -> None:
    code, output = await containers.run_to_end(images.shadowpod, ["gateway"])
    assert code == 2
    assert "--control-token-file" in output
    assert "Traceback" not in output
