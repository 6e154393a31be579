"""Hollow agents listen where nothing else does: another process on this machine (a
second benchmark, a test's kubelet) may already hold some of 127/8 — the first real
cluster run of `bench rollout` lost four pods to it, Pending for ever."""

from __future__ import annotations

import socket
from pathlib import Path

import aiohttp

from shadowpod.agent.identity import Identity
from shadowpod.bench.hollow_agents import FIRST_ADDRESS, HollowAgents, bench_agent
from shadowpod.kube import names


async def test_an_address_another_process_holds_is_skipped(tmp_path: Path) -> None:
    # The first address the agents would take that no one holds yet, now held here.
    taken = socket.socket()
    candidate = FIRST_ADDRESS
    while True:
        try:
            taken.bind((str(candidate), names.AGENT_PORT))
            break
        except OSError:
            candidate += 1
    taken.listen()
    Identity.write(tmp_path, session="ns.s", instance="p", gateway="http://127.0.0.1:1", token="t")
    agents = HollowAgents(None, {"img:v1": bench_agent(1)})  # type: ignore[arg-type]
    try:
        address, _runtime, runner = await agents._serve(
            "img:v1", {"SHADOWPOD_IDENTITY_DIR": str(tmp_path), "SHADOWPOD_MODE": "shadow"}
        )
        try:
            assert address != str(candidate)
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://{address}:{names.AGENT_PORT}/v1/status") as answer,
            ):
                assert answer.status == 200
                assert (await answer.json())["instance"] == "p"
        finally:
            await runner.cleanup()
    finally:
        taken.close()
