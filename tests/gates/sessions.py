"""A real session of the reference agent, recorded as a golden file (for the gates' tests)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shadowpod.client.goldens import record_golden
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images
from tests.agent.support import post, read_journal, wait_answered

SESSION: Final = "s1"
CONVERSATION: Final = (
    "my name is Ada",
    "remember: always answer in English",
    "weather Oslo",
    "what is my name?",
    "charge 10",
    "hello there",
    "what's my name",
)
# A credential value that a user pasted into the chat: the recorder must not keep it.
LEAKED_KEY: Final = "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e"


@dataclass(frozen=True)
class Recorded:
    golden: Path
    head: int  # the journal head when it was recorded
    control_token: str


async def record_reference_session(workdir: Path, image: str = "refagent:v2") -> Recorded:
    """Runs ``image`` as the owner of a session, has the conversation, records it all."""
    async with LocalDeployment(workdir, reference_images()) as dep:
        await dep.create_session(SESSION, image=image, instance="owner-1")
        async with dep.client() as client:
            seqs = [await post(client, text, SESSION) for text in CONVERSATION]
            seqs.append(await post(client, f"my key is {LEAKED_KEY}", SESSION))
            await wait_answered(dep.admin, seqs, SESSION)
        golden = await record_golden(
            dep.admin, SESSION, from_seq=1, secrets=[dep.gateway.control_token]
        )
        head = (await read_journal(dep.admin, SESSION))[-1].seq
        path = workdir / "refagent-v2.golden.jsonl"
        golden.write(path)
        return Recorded(path, head, dep.gateway.control_token)


def record_in_own_loop(workdir: Path) -> Recorded:
    return asyncio.run(record_reference_session(workdir))
