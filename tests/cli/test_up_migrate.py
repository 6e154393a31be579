"""``shadowpod up`` keeps a local deployment running; ``shadowpod migrate`` moves its
session live while a client talks to it; ``shadowpod status`` says what runs. All
three as real processes, the client over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from shadowpod.client.gateway import GatewayClient
from shadowpod.local.gateway_process import free_port
from shadowpod.local.load import ClientLoad
from tests.agent.support import post, replies_to, wait_answered
from tests.cli.test_cli import shadowpod

REFAGENT = Path(__file__).parents[2] / "examples" / "01-reference-agent" / "refagent.py"


def _map(tmp_path: Path) -> Path:
    def ref(version: str) -> dict[str, object]:
        return {
            "command": ["{python}", str(REFAGENT), "--version", version],
            "state_schema": int(version),
            "reads_state_schemas": [1, 2] if version == "2" else [1],
        }

    images = {
        "refagent:v1": ref("1"),
        "refagent:v2": ref("2"),
        "refagent:v2-b": ref("2"),
        # In the map, but dies as it starts: the migration rolls back.
        "broken:v3": {
            "command": ["{python}", "-c", "import sys; sys.exit('no model weights found')"],
            "state_schema": 2,
            "reads_state_schemas": [1, 2],
        },
    }
    path = tmp_path / "images.yaml"
    path.write_text(yaml.safe_dump({"images": images}))
    return path


def _start(tmp_path: Path, workdir: Path, *args: str) -> subprocess.Popen[str]:
    """`shadowpod up` as a shell starts a background job (SIGINT ignored: ``up`` must
    still stop on it), once it serves."""
    output = (tmp_path / "up.out").open("a")
    up = [sys.executable, "-m", "shadowpod", "up", "--workdir", str(workdir), *args]
    process = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *up],
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    output.close()
    deadline = time.monotonic() + 60
    while _serving_pid(workdir) != process.pid:  # not a killed one's up.json
        assert process.poll() is None, (tmp_path / "up.out").read_text()
        assert time.monotonic() < deadline, "shadowpod up did not start"
        time.sleep(0.05)
    return process


def _serving_pid(workdir: Path) -> int | None:
    try:
        return int(json.loads((workdir / "up.json").read_text())["pid"])
    except (OSError, ValueError):
        return None


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    workdir = tmp_path / "w"
    process = _start(tmp_path, workdir, "--images", str(_map(tmp_path)), "--session", "chat")
    try:
        yield workdir, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _agent_pids(workdir: Path) -> list[int]:
    """Processes of this deployment: its agents (their environment names the work
    directory) and its gateway (its command line does)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        agent = str(workdir).encode() in environ and b"SHADOWPOD_" in environ
        gateway = b"gateway" in cmdline and str(workdir).encode() in cmdline
        if agent or gateway:
            pids.append(int(entry.name))
    return pids


async def _talk_while(workdir: Path, migrations: list[list[str]]) -> tuple[list[int], ClientLoad]:
    facts = json.loads((workdir / "up.json").read_text())
    codes = []
    async with GatewayClient(facts["gateway"]) as client:
        load = ClientLoad(client, "chat", 20.0)
        watcher = asyncio.create_task(load.watch())
        stop = asyncio.Event()
        sender = asyncio.create_task(load.run(stop))
        await asyncio.sleep(1.0)
        for args in migrations:
            done = await asyncio.to_thread(shadowpod, "migrate", "--workdir", str(workdir), *args)
            codes.append(done.returncode)
            assert done.returncode in (0, 1), done.stderr
            await asyncio.sleep(0.5)
        stop.set()
        await sender
        assert await load.wait_answered(30)
        watcher.cancel()
    return codes, load


def test_up_serves_migrate_moves_it_twice_under_load_and_sigterm_stops_all(
    deployment: tuple[Path, subprocess.Popen[str]],
) -> None:
    workdir, process = deployment
    codes, load = asyncio.run(
        _talk_while(workdir, [["--to", "refagent:v2"], ["--to", "refagent:v2-b"]])
    )
    assert codes == [0, 0]
    verdict = load.verdict()
    assert verdict.accepted > 30
    assert (verdict.lost, verdict.duplicated, verdict.reordered) == (0, 0, 0)
    assert set(verdict.versions) == {"1", "2"}

    status = shadowpod("status", "--workdir", str(workdir), "--json")
    assert status.returncode == 0, status.stderr
    facts = json.loads(status.stdout)
    [session] = facts["sessions"]
    assert session["image"] == "refagent:v2-b"
    assert [m["phase"] for m in facts["migrations"]] == ["Succeeded", "Succeeded"]

    assert _agent_pids(workdir), "the owner should be running"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, (workdir.parent / "up.out").read_text()
    assert _agent_pids(workdir) == []
    assert not (workdir / "up.json").exists()


def test_a_migration_to_an_image_that_dies_rolls_back_with_the_reason(
    deployment: tuple[Path, subprocess.Popen[str]],
) -> None:
    workdir, process = deployment
    codes, load = asyncio.run(_talk_while(workdir, [["--to", "broken:v3"]]))
    assert codes == [1]
    verdict = load.verdict()
    assert (verdict.lost, verdict.duplicated) == (0, 0)
    assert set(verdict.versions) == {"1"}
    again = shadowpod("migrate", "--workdir", str(workdir), "--to", "broken:v3")
    assert again.returncode == 1
    last = again.stderr.strip().splitlines()[-1]
    assert "RolledBack" in last and "no model weights found" in last, again.stderr
    # The session kept its owner and still moves.
    assert shadowpod("migrate", "--workdir", str(workdir), "--to", "refagent:v2").returncode == 0
    # Ctrl-C stops it as SIGTERM does.
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0
    assert _agent_pids(workdir) == []


def test_an_image_not_in_the_map_or_no_deployment_cannot_run(
    deployment: tuple[Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    workdir, _ = deployment
    unknown = shadowpod("migrate", "--workdir", str(workdir), "--to", "refagent:v9")
    assert unknown.returncode == 2
    assert "'refagent:v9' is not in the local image map" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    nothing = shadowpod("migrate", "--workdir", str(tmp_path / "none"), "--to", "refagent:v2")
    assert nothing.returncode == 2
    assert "no deployment running in" in nothing.stderr
    assert "shadowpod up --workdir" in nothing.stderr


def test_up_refuses_a_used_workdir(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("x")
    result = shadowpod("up", "--workdir", str(tmp_path))
    assert result.returncode == 2
    assert "is not empty" in result.stderr
    assert os.listdir(tmp_path) == ["old.txt"]


def test_a_killed_up_is_said_so_by_migrate_and_resumed_by_up(
    deployment: tuple[Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    workdir, process = deployment
    assert _ask(workdir, "my name is Ada").startswith("[v1]")
    process.kill()  # SIGKILL: no clean-up, its files stay ...
    process.wait()
    deadline = time.monotonic() + 10
    while _agent_pids(workdir):  # ... but its children die with it
        assert time.monotonic() < deadline, "agents outlived a killed shadowpod up"
        time.sleep(0.1)
    moved = shadowpod("migrate", "--workdir", str(workdir), "--to", "refagent:v2")
    assert moved.returncode == 2
    assert "does not answer" in moved.stderr and "is `shadowpod up` still running?" in moved.stderr
    again = _start(tmp_path, workdir)
    try:
        assert "Ada" in _ask(workdir, "what is my name?")
        assert (
            "resumed on refagent:v1 from its journal (epoch 1 → 2)"
            in (tmp_path / "up.out").read_text()
        )
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=60) == 0


def test_up_again_resumes_the_session_where_it_was(
    deployment: tuple[Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Stopped and started again on its directory, the session is the same session:
    its memory, its turn count, its image after a migration, its URL."""
    workdir, process = deployment
    before = json.loads((workdir / "up.json").read_text())
    assert _ask(workdir, "my name is Ada").startswith("[v1]")
    assert shadowpod("migrate", "--workdir", str(workdir), "--to", "refagent:v2").returncode == 0
    counted = _ask(workdir, "how many?")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert not (workdir / "up.json").exists()

    again = _start(tmp_path, workdir)  # no --images: the deployment's own map
    try:
        after = json.loads((workdir / "up.json").read_text())
        assert after["gateway"] == before["gateway"]
        [session] = after["sessions"]
        assert (session["session"], session["image"]) == ("chat", "refagent:v2")
        reply = _ask(workdir, "what is my name?")
        assert reply.startswith("v2") and "Ada" in reply, reply
        assert _turn(_ask(workdir, "and now?")) == _turn(counted) + 2
        # And it still moves.
        moved = shadowpod("migrate", "--workdir", str(workdir), "--to", "refagent:v2-b")
        assert moved.returncode == 0, moved.stderr
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=60) == 0
    assert _agent_pids(workdir) == []


def test_a_first_start_that_fails_leaves_nothing_behind(tmp_path: Path) -> None:
    images = str(_map(tmp_path))
    fresh = tmp_path / "fresh"
    result = shadowpod("up", "--workdir", str(fresh), "--images", images, "--image", "broken:v3")
    assert result.returncode == 2
    assert "no model weights found" in result.stderr
    assert f"nothing was left in {fresh}" in result.stderr
    assert not fresh.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    result = shadowpod("up", "--workdir", str(empty), "--images", images, "--image", "broken:v3")
    assert result.returncode == 2
    assert os.listdir(empty) == []
    assert _agent_pids(fresh) == _agent_pids(empty) == []


def _ask(workdir: Path, content: str) -> str:
    """Say ``content`` to the deployment's session, as a client does; its reply."""

    facts = json.loads((workdir / "up.json").read_text())
    [session] = facts["sessions"]
    token = Path(facts["control_token_file"]).read_text().strip()

    async def ask() -> str:
        async with GatewayClient(facts["gateway"], token) as admin:
            seq = await post(admin, content, session["session"])
            entries = await wait_answered(admin, [seq], session["session"])
        [reply] = replies_to(entries, seq)
        return str(reply.payload["content"])

    return asyncio.run(ask())


def _turn(reply: str) -> int:
    """The reference agent's turn count: "[v1] #7 …" or "v2 > turn 7: …"."""
    found = re.search(r"(?:#|turn )(\d+)", reply)
    assert found, reply
    return int(found.group(1))


def test_up_serves_on_the_port_given(tmp_path: Path) -> None:
    port = free_port()
    workdir = tmp_path / "w"
    process = _start(tmp_path, workdir, "--images", str(_map(tmp_path)), "--port", str(port))
    try:
        assert json.loads((workdir / "up.json").read_text())["gateway"].endswith(f":{port}")
        assert _ask(workdir, "hello").startswith("[v1]")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
