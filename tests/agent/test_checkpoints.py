"""Checkpoint requests (``POST /v1/checkpoint``), without CRIU: the agent forks a
stopped copy of itself that holds no network connection (what CRIU 4.1 can dump on
any kernel) and goes on serving; an agent that cannot be checkpointed says why.

The copy restored by CRIU elsewhere, caught up and promoted: tests/image/test_criu.py.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shadowpod.agent.checkpoint import _private_epoll
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images
from tests.agent.support import SESSION, agent_get, post, wait_answered, wait_for


@pytest.fixture
async def checkpointable(tmp_path: Path) -> AsyncIterator[LocalDeployment]:
    """Reference agents as the CRIU runtime runs them (asyncio's own event loop)."""
    async with LocalDeployment(tmp_path, reference_images(), checkpoints=True) as deployment:
        yield deployment


async def checkpoint(dep: LocalDeployment, instance: str, body: Any) -> tuple[int, Any]:
    found = dep.runtime.instance(instance)
    assert found is not None
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{found.url}/v1/checkpoint", json=body) as response,
    ):
        return response.status, await response.json()


def state_of(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def internet_sockets(pid: int) -> list[str]:
    """The descriptors of ``pid`` that are TCP or UDP sockets (CRIU 4.1 cannot dump
    them on Linux >= 6.16)."""
    inodes = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if path.exists():
            inodes |= {line.split()[9] for line in path.read_text().splitlines()[1:]}
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith("socket:[") and target[8:-1] in inodes:
            found.append(f"{fd} -> {target}")
    return found


async def test_a_checkpoint_is_a_stopped_copy_without_connections_and_the_owner_serves_on(
    checkpointable: LocalDeployment, tmp_path: Path
) -> None:
    dep = checkpointable
    async with dep.client() as client:
        await dep.create_session(SESSION, image="refagent:v1", instance="v1")
        await wait_answered(dep.admin, [await post(client, "my name is Ada")])
        owner = dep.runtime.instance("v1")
        assert owner is not None
        assert internet_sockets(owner.process.pid)  # the owner's own: listener, gateway

        code, taken = await checkpoint(dep, "v1", {"output": str(tmp_path / "copy.log")})
        assert code == 201, taken
        status = await agent_get(dep, "v1", "/v1/status")
        assert (taken["instance"], taken["epoch"]) == ("v1", 1)
        assert 0 < taken["watermark"] <= status["watermark"]
        copy = taken["pid"]
        await wait_for(
            lambda: _ready(state_of(copy) in ("T", "t")), "the copy stopping itself", 5.0
        )
        assert internet_sockets(copy) == []

        # The owner never paused: it answers on, while its copy waits to be dumped.
        answered = await wait_answered(dep.admin, [await post(client, "still there?")])
        assert any(e.payload.get("content", "").endswith("still there? (hi Ada)") for e in answered)

        # What CRIU does after a dump: the copy is killed; the owner reaps it.
        os.kill(copy, signal.SIGKILL)
        await wait_for(lambda: _ready(state_of(copy) is None), "the copy reaped", 5.0)
        assert (await agent_get(dep, "v1", "/v1/status"))["mode"] == "owner"


async def _ready(done: bool) -> bool | None:
    await asyncio.sleep(0)
    return True if done else None


async def test_an_agent_on_uvloop_refuses_a_checkpoint_saying_how_to_allow_it(
    tmp_path: Path,
) -> None:
    async with LocalDeployment(tmp_path, reference_images()) as dep:
        await dep.create_session(SESSION, image="refagent:v1", instance="v1")
        code, body = await checkpoint(dep, "v1", {})
        assert code == 409
        assert body["reason"] == "CheckpointRefused"
        assert "SHADOWPOD_EVENT_LOOP=asyncio" in body["message"]
        code, body = await checkpoint(dep, "v1", {"wait_s": -1})
        assert (code, body["reason"]) == (400, "BadRequest")


def test_a_copy_keeps_its_own_epoll_entries_though_the_parent_adds_more_after_the_fork() -> None:
    """The parent serves on while the copy rebuilds its epoll from the shared interest
    list: a descriptor the parent registered after the fork is not the copy's. Before,
    the copy gave up on it (EBADF) and exited instead of stopping for the dump."""
    shared = select.epoll()
    mine = socket.socketpair()
    opened = [*mine]
    shared.register(mine[0].fileno(), select.EPOLLIN)
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: waits until the parent has registered one more
        code = 1
        try:
            os.read(go_read, 1)
            _private_epoll(shared.fileno())
            with open(f"/proc/self/fdinfo/{shared.fileno()}") as info:
                listed = [line.split()[1] for line in info if line.startswith("tfd:")]
            code = 0 if listed == [str(mine[0].fileno())] else 3
        except OSError:
            code = 2
        finally:
            os._exit(code)
    try:
        # Opened after the fork, numbered past anything the copy has.
        opened += [socket.socket() for _ in range(8)]
        shared.register(opened[-1].fileno(), select.EPOLLIN)
        os.write(go_write, b"x")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        shared.close()
        for sock in opened:
            sock.close()
        os.close(go_read)
        os.close(go_write)
