"""Schema versions come from the agent's code: an image map may leave them out, and
the local runtime then asks the code (``SHADOWPOD_DESCRIBE=1``) — the preflight of a
migration reads what the agent itself declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadowpod.engine.ports import RuntimeFailure
from shadowpod.engine.record import InstanceRef, MigrationPolicy, Phase
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import DescribedImages, ImageMap
from shadowpod.local.runtime import LocalRuntime

AGENTS = Path(__file__).parents[1] / "agent" / "agents.py"


def _runtime(tmp_path: Path, images: dict[str, object]) -> LocalRuntime:
    return LocalRuntime(
        ImageMap.from_data({"images": images}),
        gateway_url="http://127.0.0.1:9",
        workdir=tmp_path,
        described=DescribedImages(tmp_path / "described"),
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


REFAGENT = Path(__file__).parents[2] / "examples" / "01-reference-agent" / "refagent.py"


def _counting_agent(tmp_path: Path) -> tuple[Path, Path]:
    """The reference agent behind a script that counts the runs asked to describe
    themselves (``SHADOWPOD_DESCRIBE=1``), in a file: real processes, counted."""
    probes = tmp_path / "probes"
    script = tmp_path / "images" / "agent.py"
    script.parent.mkdir()
    script.write_text(
        "import os, runpy, sys\n"
        "if os.environ.get('SHADOWPOD_DESCRIBE') == '1':\n"
        f"    with open({str(probes)!r}, 'a') as out:\n"
        "        out.write(sys.argv[-1] + '\\n')\n"
        f"sys.argv[0] = {str(REFAGENT)!r}\n"
        f"runpy.run_path({str(REFAGENT)!r}, run_name='__main__')\n"
    )
    return script, probes


def _probes(probes: Path) -> list[str]:
    return probes.read_text().split() if probes.exists() else []


async def test_a_second_move_to_an_image_does_not_start_it_to_ask_its_schema(
    tmp_path: Path,
) -> None:
    """Each move used to start the target image once, to ask its schema versions (8-17 s
    for a LangGraph agent): what it said is now kept by the image's digest, so a move in
    another deployment (another CLI run, a restarted engine) to the same image asks no
    more — and a changed agent is asked again."""
    script, probes = _counting_agent(tmp_path)
    images = ImageMap.from_data(
        {
            "images": {
                "counted:v1": {"command": ["{python}", str(script), "--version", "1"]},
                "counted:v2": {"command": ["{python}", str(script), "--version", "2"]},
            }
        }
    )
    described = DescribedImages(tmp_path / "described")
    for run in (1, 2):
        async with LocalDeployment(tmp_path / f"run{run}", images, described=described) as dep:
            await dep.create_session("s", image="counted:v1", instance="s-v1")
            record = dep.plan(
                "s",
                source=InstanceRef(name="s-v1", image="counted:v1"),
                target_image="counted:v2",
                policy=MigrationPolicy(phase_timeout_s=30.0),
            )
            record = await dep.migrate(record)
            assert record.phase is Phase.SUCCEEDED, record.error
        # Each image asked once, in the first run only.
        assert sorted(_probes(probes)) == ["1", "2"], run

    # The agent's code changed: its digest with it, so it is asked again.
    script.write_text(script.read_text() + "# changed\n")
    runtime = LocalRuntime(
        images, gateway_url="http://127.0.0.1:9", workdir=tmp_path / "after", described=described
    )
    info = await runtime.describe("counted:v2")
    assert (info.state_schema, info.reads_state_schemas) == (2, [1, 2])
    assert sorted(_probes(probes)) == ["1", "2", "2"]
