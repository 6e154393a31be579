"""``shadowpod fork`` on a running ``shadowpod up``: a new session from the session's
state at a seq, with an owner of its own, while the session serves on. Real
processes, real HTTP."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

from shadowpod.client.gateway import GatewayClient
from tests.cli.test_cli import shadowpod
from tests.cli.test_up_migrate import deployment

__all__ = ["deployment"]


async def _ask(client: GatewayClient, session: str, content: str, id: str) -> str:
    posted = await client.post_message(session, content, id=id)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        page = await client.events(session, after=posted.seq, kinds=["message"], wait_s=1.0)
        for event in page.events:
            payload = event["payload"]
            if payload.get("turn") == posted.seq and payload.get("role") == "assistant":
                return str(payload["content"])
    raise AssertionError(f"no answer to {content!r} on {session} in 60 s")


async def _fork_and_ask(workdir: Path) -> tuple[str, str, subprocess.CompletedProcess[str]]:
    facts = json.loads((workdir / "up.json").read_text())
    async with GatewayClient(facts["gateway"]) as client:
        await _ask(client, "chat", "my name is Ada", id="ada")
        seq = (await client.status("chat")).head
        await _ask(client, "chat", "my name is Bob", id="bob")
        done = await asyncio.to_thread(
            shadowpod, "fork", "--workdir", str(workdir), "chat-try", "--seq", str(seq)
        )
        assert done.returncode == 0, done.stderr
        forked = await _ask(client, "chat-try", "what is my name?", id="ask-fork")
        parent = await _ask(client, "chat", "what is my name?", id="ask-parent")
    beyond = ["--seq", "100000", "--session", "chat"]
    refused = await asyncio.to_thread(
        shadowpod, "fork", "--workdir", str(workdir), "chat-two", *beyond
    )
    return forked, parent, refused


def test_a_fork_answers_from_the_sessions_state_at_the_seq(
    deployment: tuple[Path, subprocess.Popen[str]],
) -> None:
    workdir, _ = deployment
    forked, parent, refused = asyncio.run(_fork_and_ask(workdir))
    assert "Ada" in forked and "Bob" in parent
    assert refused.returncode == 2 and "head" in refused.stderr
    status = shadowpod("status", "--workdir", str(workdir), "--json")
    names = {s["session"] for s in json.loads(status.stdout)["sessions"]}
    assert names == {"chat", "chat-try"}
