"""The demo's verdict is what a client saw: replies that fall behind the load fail it,
saying the rate the agent sustained; replies that do not say which version answered
fail the version check instead of passing it unread. Real agents, real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli.test_cli import shadowpod

SLOW_AGENT = """
import asyncio
import sys
from shadowpod.agent import Agent, Turn

agent = Agent("slow", version=sys.argv[1])

@agent.on_message
async def handle(turn: Turn) -> None:
    await asyncio.sleep(float(sys.argv[2]))  # a turn takes this long: one at a time
    if sys.argv[3] == "versioned":
        await turn.reply("ok", version=agent.version)
    else:
        await turn.reply("ok")

agent.run()
"""


pytestmark = pytest.mark.timeout(300)


def _map(tmp_path: Path, turn_s: float, replies: str) -> Path:
    script = tmp_path / "agent.py"
    script.write_text(SLOW_AGENT)
    images = {
        f"slow:v{v}": {"command": ["{python}", str(script), str(v), str(turn_s), replies]}
        for v in (1, 2)
    }
    path = tmp_path / "images.yaml"
    path.write_text(yaml.safe_dump({"images": images}))
    return path


def _demo(tmp_path: Path, turn_s: float, replies: str, rate: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    result = shadowpod(
        "demo", "--json", "--rate", rate, "--before", "1.5", "--after", "1.5",
        "--images", str(_map(tmp_path, turn_s, replies)), "--from", "slow:v1", "--to", "slow:v2",
        timeout=240,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def _check(report: dict, name: str) -> dict:  # type: ignore[type-arg]
    return next(c for c in report["checks"] if c["name"] == name)


def test_an_agent_slower_than_the_load_fails_saying_the_rate_it_sustains(tmp_path: Path) -> None:
    """Turns of 0.25 s: at most 4 msg/s, sent 12. Every message is still answered, in
    order, once — and the run fails, because clients waited seconds for it."""
    code, report = _demo(tmp_path, 0.25, "versioned", "12")
    assert code == 1
    assert not report["ok"]
    assert report["invariants"] == {"lost": 0, "duplicated": 0, "reordered": 0}
    kept_up = _check(report, "replies kept up with the load")
    assert not kept_up["ok"]
    assert "replies fell behind: p99" in kept_up["detail"]
    sustained = float(kept_up["detail"].split("the agent answered ")[1].split(" msg/s")[0])
    assert 1 <= sustained <= 4.4, kept_up["detail"]
    assert "while 12 msg/s were sent" in kept_up["detail"]


def test_replies_that_do_not_say_their_version_fail_the_version_check(tmp_path: Path) -> None:
    code, report = _demo(tmp_path, 0.0, "unversioned", "20")
    assert code == 1
    check = _check(report, "one version per reply")
    assert not check["ok"]
    assert "replies carry no meta.version" in check["detail"]
    assert "turn.reply(text, version=agent.version)" in check["detail"]


def test_the_quick_smoke_run_is_gentle_enough_for_a_busy_machine() -> None:
    """`demo --quick` (the README's and the wheel test's smoke run) sends 50 msg/s, not
    the full demo's 200, at which the reference agent on a 2-core machine busy with
    other work fell behind (117 msg/s answered, seen) and the smoke run failed."""
    result = shadowpod("demo", "--quick", "--json", timeout=240)
    report = json.loads(result.stdout)
    assert report["rate"] == 50
    assert result.returncode == 0, _check(report, "replies kept up with the load")
    assert report["ok"]
