"""Nothing an owner started outlives it: its background processes die with it, what
they started is cleaned up after it, and the journal says what was killed.

Owners are killed here as the kernel or an impatient user would (``kill -9`` of the
agent's pid), not through the runtime: nothing gets a chance to tidy up first.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from shadowpod.agent.processes import ProcessRegistry
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.payloads import ControlEvent, EntryKind
from shadowpod.domain.state import ProcessStatus
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images
from tests.agent.agents import LEAVER
from tests.agent.support import (
    SESSION,
    alive,
    folded,
    lines_of,
    of_kind,
    post,
    read_journal,
    replies_to,
    wait_answered,
    wait_for,
)

OWNER = "owner-1"


async def _spawned(
    dep: LocalDeployment, client: GatewayClient, tmp_path: Path, name: str, kind: str
) -> tuple[int, str]:
    """Spawn a background process through a turn; its pid and what it wrote when up."""
    seq = await post(client, f"spawn {name} {kind}")
    (reply,) = replies_to(await wait_answered(dep.admin, [seq]), seq)

    async def up() -> str | None:
        written = lines_of(tmp_path / f"{name}.up")
        return written[0] if written else None

    return reply.payload["meta"]["pid"], await wait_for(up, f"{name} to be set up")


async def _gone(pids: list[int]) -> bool | None:
    return not any(alive(pid) for pid in pids) or None


async def test_a_killed_owners_processes_and_theirs_die_and_the_journal_says_so(
    dep: LocalDeployment, client: GatewayClient, tmp_path: Path
) -> None:
    await dep.create_session(SESSION, image="surfaces:1", instance=OWNER)
    worker, _ = await _spawned(dep, client, tmp_path, "worker", "stubborn")  # ignores SIGTERM
    tree, up = await _spawned(dep, client, tmp_path, "tree", "tree")
    grandchild = int(up.split()[1])  # in a process group of its own: no signal reaches it
    owner = dep.runtime.instance(OWNER)
    assert owner is not None and all(alive(pid) for pid in (worker, tree, grandchild))

    os.kill(owner.process.pid, signal.SIGKILL)
    await wait_for(lambda: _gone([worker, tree, grandchild]), "everything the owner started to die")

    # The runtime journaled, on the dead owner's behalf, what became of its processes.
    async def reported() -> list[object] | None:
        entries = await read_journal(dep.admin)
        drained = [
            e for e in of_kind(entries, EntryKind.CONTROL) if e.payload["event"] == "drained"
        ]
        return entries if drained else None

    entries = await wait_for(reported, "a drain report for the dead owner")
    (report,) = [
        e for e in of_kind(entries, EntryKind.CONTROL) if e.payload["event"] == ControlEvent.DRAINED
    ]
    assert (report.payload["owner"], report.payload["epoch"]) == (OWNER, 1)
    processes = folded(entries).processes
    assert {name: (p.status, p.pid) for name, p in processes.items()} == {
        "worker": (ProcessStatus.KILLED, worker),
        "tree": (ProcessStatus.KILLED, tree),
    }
    # And its status says what was killed, the unregistered grandchild too.
    status = await dep.runtime.status(OWNER)
    assert (status.alive, status.mode) == (False, "crashed")
    assert f"worker (pid {worker}): killed" in status.left_behind
    assert f"tree (pid {tree}): killed" in status.left_behind
    assert any(line.startswith(f"pid {grandchild} ") for line in status.left_behind)


async def test_a_killed_reference_agents_indexer_dies_with_it(tmp_path: Path) -> None:
    """The reference agent (the demo's) starts an ``indexer`` whenever it owns."""
    async with LocalDeployment(tmp_path, reference_images()) as dep:
        await dep.create_session(SESSION, image="refagent:v1", instance="v1")

        async def indexer() -> int | None:
            for entry in of_kind(await read_journal(dep.admin), EntryKind.PROCESS):
                if entry.payload["name"] == "indexer" and entry.payload["op"] == "started":
                    return int(entry.payload["pid"])
            return None

        pid = await wait_for(indexer, "the indexer to start")
        v1 = dep.runtime.instance("v1")
        assert v1 is not None and alive(pid)
        os.kill(v1.process.pid, signal.SIGKILL)
        await wait_for(lambda: _gone([pid]), "the indexer to die with its owner")
        status = await dep.runtime.status("v1")
        assert f"indexer (pid {pid}): killed" in status.left_behind


async def test_a_drain_stops_what_an_exited_process_left_in_its_group(tmp_path: Path) -> None:
    registry = ProcessRegistry()
    marker = tmp_path / "leaver.up"
    pid = await registry.spawn("leaver", [sys.executable, "-c", LEAVER, str(marker)])

    async def left() -> int | None:
        written = lines_of(marker)
        return int(written[0].split()[1]) if written else None

    grandchild = await wait_for(left, "the leaver to start its child")
    await wait_for(lambda: _gone([pid]), "the leaver to exit")
    assert alive(grandchild)

    (report,) = await registry.drain(grace_s=0.5)
    assert (report.name, report.outcome, report.exit_code) == ("leaver", "exited", 0)
    await wait_for(lambda: _gone([grandchild]), "the child it left to be stopped", timeout_s=5)


async def test_a_background_process_dies_with_its_parent_however_it_dies(tmp_path: Path) -> None:
    """The parent-death signal, on its own: a process that registered a background
    process is SIGKILLed; nobody cleans up after it, the kernel does."""
    probe = tmp_path / "child.pid"
    parent_code = (
        "import asyncio, sys, pathlib\n"
        "from shadowpod.agent.processes import ProcessRegistry\n"
        "async def main():\n"
        "    pid = await ProcessRegistry().spawn('sleeper', "
        "[sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "    pathlib.Path(sys.argv[1]).write_text(str(pid))\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    parent = await asyncio.create_subprocess_exec(sys.executable, "-c", parent_code, str(probe))
    try:

        async def child() -> int | None:
            written = lines_of(probe)
            return int(written[0]) if written else None

        pid = await wait_for(child, "the background process to start")
        assert alive(pid)
        parent.kill()
        await parent.wait()
        await wait_for(lambda: _gone([pid]), "the background process to die with its parent")
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()
