"""Helpers for the agent runtime tests: test images, reading the journal, waiting.

Everything here talks to real processes over real HTTP; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Final, TypeVar

import aiohttp

from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import ImageMap

AGENTS: Final = Path(__file__).with_name("agents.py")
SESSION: Final = "s1"
WAIT_S: Final = 15.0
POLL_S: Final = 0.02
T = TypeVar("T")


def agent_images(workdir: Path) -> ImageMap:
    """The test agents as images. ``{here}`` is the test's own directory."""
    env = {
        "SHADOWPOD_DRAIN_GRACE_S": "0.5",
        "SHADOWPOD_SNAPSHOT_EVERY": "0",
        "PROBE_DIR": "{here}",
        "SIDEFX_LOG": "{here}/sidefx.log",
    }
    return ImageMap.from_data(
        {
            "images": {
                "surfaces:1": {"command": ["{python}", str(AGENTS), "surfaces"], "env": env},
                # Reads surfaces:1's state (schema 1) through a migration.
                "surfaces:2": {
                    "command": ["{python}", str(AGENTS), "surfaces2"],
                    "env": env,
                    "state_schema": 2,
                    "reads_state_schemas": [1, 2],
                },
                # Believes the gateway takes 8 MiB per append: it must learn otherwise.
                "surfaces:big-appends": {
                    "command": ["{python}", str(AGENTS), "surfaces"],
                    "env": {**env, "SHADOWPOD_MAX_APPEND_BYTES": str(8 * 1024 * 1024)},
                },
                # Its on_shadow_ready hook raises (after noting that it ran).
                "surfaces:warm-fails": {
                    "command": ["{python}", str(AGENTS), "surfaces"],
                    "env": {**env, "WARM_FAILS": "1"},
                },
                # Its drain outlasts the next owner's start (a process start took
                # over 2 s on a loaded 2-core machine: the report then came first).
                "surfaces:slow-drain": {
                    "command": ["{python}", str(AGENTS), "surfaces"],
                    "env": {**env, "SHADOWPOD_DRAIN_GRACE_S": "8"},
                },
                # The tool call outlives any test: the owner is killed in the middle of it.
                "sidefx:slow": {
                    "command": ["{python}", str(AGENTS), "sidefx"],
                    "env": {**env, "SIDEFX_TOOL_S": "300"},
                },
                "sidefx:fast": {
                    "command": ["{python}", str(AGENTS), "sidefx"],
                    "env": {**env, "SIDEFX_TOOL_S": "0"},
                },
                "sidefx:changed-mind": {
                    "command": ["{python}", str(AGENTS), "sidefx"],
                    "env": {**env, "SIDEFX_TOOL_S": "0", "SIDEFX_CHANGED_MIND": "1"},
                },
            }
        },
        here=workdir,
    )


async def wait_for(
    check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = WAIT_S
) -> T:
    """Poll ``check`` until it returns something other than ``None``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(POLL_S)


async def read_journal(admin: GatewayClient, session: str = SESSION) -> list[JournalEntry]:
    """The whole journal of ``session``, through the control client."""
    entries: list[JournalEntry] = []
    while True:
        page, head = await admin.journal(session, after=entries[-1].seq if entries else 0)
        entries += page
        if not page or entries[-1].seq >= head:
            return entries


def of_kind(entries: Iterable[JournalEntry], kind: str) -> list[JournalEntry]:
    return [e for e in entries if e.kind == kind]


def replies(entries: Iterable[JournalEntry]) -> list[JournalEntry]:
    """Assistant messages, in journal order."""
    return [
        e
        for e in entries
        if e.kind == EntryKind.MESSAGE and e.epoch > 0 and e.payload.get("role") == "assistant"
    ]


def replies_to(entries: Iterable[JournalEntry], turn: int) -> list[JournalEntry]:
    return [e for e in replies(entries) if e.payload.get("turn") == turn]


def acked(entries: Iterable[JournalEntry]) -> set[int]:
    return {int(e.payload["turn"]) for e in entries if e.kind == EntryKind.ACK}


async def post(client: GatewayClient, content: str, session: str = SESSION) -> int:
    """Post a user message; its inbound seq."""
    return (await client.post_message(session, content)).seq


async def wait_answered(
    admin: GatewayClient, seqs: Iterable[int], session: str = SESSION, timeout_s: float = WAIT_S
) -> list[JournalEntry]:
    """The journal once every inbound seq in ``seqs`` is acked and has a reply."""
    wanted = set(seqs)

    async def done() -> list[JournalEntry] | None:
        entries = await read_journal(admin, session)
        answered = {e.payload.get("turn") for e in replies(entries)}
        return entries if wanted <= acked(entries) and wanted <= answered else None

    return await wait_for(done, f"replies to {sorted(wanted)}", timeout_s)


def folded(entries: Iterable[JournalEntry]) -> SessionState:
    return fold(SessionState(), entries)


async def agent_get(dep: LocalDeployment, instance: str, path: str) -> Any:
    """GET one of an agent instance's own endpoints (``/v1/state``, ``/v1/status``)."""
    found = dep.runtime.instance(instance)
    assert found is not None, f"no instance {instance!r}"
    async with (
        aiohttp.ClientSession() as http,
        http.get(found.url + path, timeout=aiohttp.ClientTimeout(total=5)) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.json()


def lines_of(path: Path) -> list[str]:
    """The lines of a small file, none if it does not exist (yet)."""
    return path.read_text().splitlines() if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
