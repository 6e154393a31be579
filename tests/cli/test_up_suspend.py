"""``shadowpod suspend`` / ``resume`` on a running ``shadowpod up``: the owner process
fenced out and stopped, clients' messages kept, and the first one wakes the session —
a new owner answering what waited, in order, once. Real processes, real HTTP."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from shadowpod.client.gateway import GatewayClient
from shadowpod.local.load import ClientLoad
from tests.cli.test_cli import shadowpod
from tests.cli.test_up_migrate import deployment

__all__ = ["deployment"]


def _facts(workdir: Path) -> dict[str, object]:
    status = shadowpod("status", "--workdir", str(workdir), "--json")
    assert status.returncode == 0, status.stderr
    facts: dict[str, object] = json.loads(status.stdout)
    return facts


async def _suspend_under_load(workdir: Path) -> tuple[ClientLoad, list[str], str]:
    facts = json.loads((workdir / "up.json").read_text())
    async with GatewayClient(facts["gateway"]) as client:
        await client.post_message("chat", "my name is Ada", id="name")
        load = ClientLoad(client, "chat", 10.0)
        watcher = asyncio.create_task(load.watch())
        stop = asyncio.Event()
        sender = asyncio.create_task(load.run(stop))
        await asyncio.sleep(1.0)
        first = facts["sessions"][0]["owner"]
        done = await asyncio.to_thread(shadowpod, "suspend", "--workdir", str(workdir))
        assert done.returncode == 0, done.stderr
        assert "suspended" in done.stdout
        await asyncio.sleep(2.0)  # the messages keep coming: the first one woke it
        stop.set()
        await sender
        assert await load.wait_answered(60)
        watcher.cancel()
        page = await client.events("chat", kinds=["control"])
        told = [e["payload"]["event"] for e in page.events]
    return load, told, first


def test_a_suspended_session_wakes_on_a_message_and_answers_each_once(
    deployment: tuple[Path, subprocess.Popen[str]],
) -> None:
    workdir, _ = deployment
    load, told, first = asyncio.run(_suspend_under_load(workdir))
    verdict = load.verdict()
    assert verdict.accepted == verdict.sent > 20
    assert (verdict.lost, verdict.duplicated, verdict.reordered) == (0, 0, 0)
    assert told.index("suspend") < told.index("wake") < told.index("resume")
    [session] = _facts(workdir)["sessions"]  # type: ignore[misc]
    assert session["owner"] != first and not session["suspended"]

    # Suspended and resumed by hand; a second resume says why it cannot.
    assert shadowpod("suspend", "--workdir", str(workdir)).returncode == 0
    [session] = _facts(workdir)["sessions"]  # type: ignore[misc]
    assert session["suspended"]
    resumed = shadowpod("resume", "--workdir", str(workdir))
    assert resumed.returncode == 0, resumed.stderr
    again = shadowpod("resume", "--workdir", str(workdir))
    assert again.returncode == 2
    assert "is not suspended" in again.stderr and "NotSuspended" in again.stderr
