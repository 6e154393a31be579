"""The README's SDK example, run as it is written: the fenced block under "Writing an
agent" is taken from README.md, started as an agent process (the local runtime) on a
real gateway, sent messages and live-migrated; its replies must be the ones the README
says. An edit that breaks the example fails here."""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shadowpod.engine.record import InstanceRef, MigrationPolicy, Phase
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import ImageMap
from tests.agent.support import post, replies_to, wait_answered

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Writing an agent"
IMAGE = "readme-example:1"
SESSION = "readme"
OWNER = "owner-1"


def readme_example() -> str:
    """The README's "Writing an agent" section's first ```python block on the SDK
    alone (the LangGraph block before it is examples/03-langgraph's, tested there)."""
    text = README.read_text()
    assert SECTION in text, f"README.md has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    blocks = [block for block in blocks if "shadowpod.integrations" not in block]
    assert blocks, f"README.md's {SECTION!r} section has no ```python block"
    return str(blocks[0])


def test_the_example_is_short_enough_to_read_at_a_glance() -> None:
    lines = [line for line in readme_example().splitlines() if line.strip()]
    assert len(lines) <= 22, f"the README's SDK example has {len(lines)} lines of code"


@pytest.fixture
async def dep(tmp_path: Path) -> AsyncIterator[LocalDeployment]:
    script = tmp_path / "agent.py"
    script.write_text(readme_example())
    images = ImageMap.from_data({"images": {IMAGE: {"command": [sys.executable, str(script)]}}})
    async with LocalDeployment(tmp_path / "deployment", images) as deployment:
        yield deployment


async def test_the_readme_agent_answers_as_the_readme_says_before_and_after_a_migration(
    dep: LocalDeployment,
) -> None:
    await dep.create_session(SESSION, image=IMAGE, instance=OWNER)
    async with dep.client() as client:
        first = await post(client, "my name is Ada", SESSION)
        second = await post(client, "how are you?", SESSION)
        entries = await wait_answered(dep.admin, [first, second], SESSION)
        assert [r.payload["content"] for r in replies_to(entries, first)] == [
            "hello ADA, message #1"
        ]
        assert [r.payload["content"] for r in replies_to(entries, second)] == [
            "hello ADA, message #2"
        ]

        # Moved live to a new instance: it answers with the memory and the count.
        record = dep.plan(
            SESSION,
            source=InstanceRef(name=OWNER, image=IMAGE),
            target_image=IMAGE,
            policy=MigrationPolicy(drain_grace_s=0.5),
        )
        done = await dep.migrate(record)
        assert done.phase is Phase.SUCCEEDED, done.error
        third = await post(client, "still there?", SESSION)
        entries = await wait_answered(dep.admin, [third], SESSION)
    (reply,) = replies_to(entries, third)
    assert reply.payload["content"] == "hello ADA, message #3"
    assert reply.epoch == 2  # from the new owner
