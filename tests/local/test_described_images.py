"""Schema versions come from the agent's code: an image map may leave them out, and
the local runtime then asks the code (``SHADOWPOD_DESCRIBE=1``) — the preflight of a
migration reads what the agent itself declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadowpod.engine.ports import RuntimeFailure
from shadowpod.local.images import ImageMap
from shadowpod.local.runtime import LocalRuntime

AGENTS = Path(__file__).parents[1] / "agent" / "agents.py"


def _runtime(tmp_path: Path, images: dict[str, object]) -> LocalRuntime:
    return LocalRuntime(
        ImageMap.from_data({"images": images}), gateway_url="http://127.0.0.1:9", workdir=tmp_path
    )


async def test_an_image_without_declared_schemas_is_described_by_its_code(tmp_path: Path) -> None:
    runtime = _runtime(
        tmp_path,
        {
            "surfaces:2": {"command": ["{python}", str(AGENTS), "surfaces2"]},
            # What a map declares still wins (a deliberate claim, right or wrong).
            "surfaces:claimed": {
                "command": ["{python}", str(AGENTS), "surfaces2"],
                "state_schema": 3,
            },
        },
    )
    described = await runtime.describe("surfaces:2")
    assert (described.state_schema, described.reads_state_schemas) == (2, [1, 2])
    claimed = await runtime.describe("surfaces:claimed")
    assert (claimed.state_schema, claimed.reads_state_schemas) == (3, [3])


async def test_an_image_that_cannot_describe_itself_says_what_to_do(tmp_path: Path) -> None:
    runtime = _runtime(
        tmp_path, {"not-an-agent:1": {"command": ["{python}", "-c", "raise SystemExit('nope')"]}}
    )
    with pytest.raises(RuntimeFailure, match=r"could not say its state schema .*nope.*declare"):
        await runtime.describe("not-an-agent:1")
