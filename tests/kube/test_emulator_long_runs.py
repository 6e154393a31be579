"""The emulator in long runs (the operator benchmark): kmock matches each request
against its request log from the start, so a log that only grows makes every
request slower; with ``keep_requests=False`` only the recent ones are kept."""

from __future__ import annotations

from pathlib import Path

import kmock
from kubernetes_asyncio import client

from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.emulator.server import RECENT_REQUESTS


async def test_without_the_request_log_it_keeps_answering_and_keeps_only_recent_requests(
    tmp_path: Path,
) -> None:
    async with ApiServerEmulator(keep_requests=False) as server, kmock.Server(server):
        kube = KubeConnection.to_emulator(str(server.url).rstrip("/"), tmp_path)
        async with kube.api() as api:
            core = client.CoreV1Api(api)
            for i in range(3 * RECENT_REQUESTS):
                await core.create_namespaced_config_map(
                    "default", {"metadata": {"name": f"c{i}"}, "data": {"i": str(i)}}
                )
            listed = await core.list_namespaced_config_map("default")
        assert len(listed.items) == 3 * RECENT_REQUESTS
        assert len(list(server)) <= RECENT_REQUESTS
    assert server.internal_errors == []
