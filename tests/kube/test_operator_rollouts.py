"""Fleet upgrades under the operator: sessions that follow an AgentDeployment, a new
template image rolled out to them in steps through the cluster-wide pacing queue —
never more migrations running than the caps, nothing lost, doubled or reordered under
client load —, a version the upgrade gate rejects halted after the canary, an abort
that moves the canary back, a pinned session that never moves, and an operator
restarted in the middle of a rollout that carries on. A few sessions each: the
benchmark (``shadowpod bench rollout``) is where a fleet is large."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from shadowpod.kube.models.v1alpha1 import API_VERSION
from shadowpod.kube.models.v1alpha1.deployment import DEPLOYMENT_LABEL, REVISION_LABEL
from tests.kube.operator_world import Load, World, invariants, plugin
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
# The README's block this file carries out on the emulator (tests/docs/test_blocks.py
# counts it as run).
README = "README.md"
SECTION = "### Fleet upgrades"

# Generous limits: a shadow on a loaded machine can take minutes to start, and a
# timed-out move would (rightly) halt the rollout these tests expect to complete.
POLICY = {
    "fenceTimeoutSeconds": 5,
    "drainGracePeriodSeconds": 2,
    "maxDurationSeconds": 600,
    "phaseTimeoutSeconds": 300,
}
FINISHED = {"Succeeded", "RolledBack", "Failed"}
# The upgrade gate of the halting rollout: two live turns, compared word for word.
GATE = {"turns": 2, "timeoutSeconds": 60, "gate": {"judge": "Exact"}}
# Every other message asks for the name the session knows: the forgetful version fails.
ASK = lambda n: "what is my name?" if n % 2 == 0 else f"message {n}"  # noqa: E731


def deployment_manifest(
    name: str, image: str, *, migration: dict[str, Any] | None = None, **strategy: Any
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentDeployment",
        "metadata": {"name": name},
        "spec": {
            "template": {"image": image},
            "migration": {**POLICY, **(migration or {})},
            "strategy": strategy,
        },
    }


def follower(name: str, deployment: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentSession",
        "metadata": {"name": name},
        "spec": {"deploymentRef": {"name": deployment}, **spec},
    }


@pytest.fixture
async def fleet(world: World) -> World:
    """The operator world (on the emulator, or on the real cluster with its kubelets)
    with the pacing queue's caps at 2 in the cluster and 1 out of one node (the defaults
    are 10 and 2: a few sessions would never queue): its operator restarted with them.
    Two or three sessions per test: on the real cluster each is a real pod of this
    2-core machine, with its shadow beside it during a move."""
    await world.stop_operator()
    world.max_concurrent_migrations = 2
    world.max_concurrent_migrations_per_node = 1
    await world.start_operator()
    return world


async def deployment(world: World, name: str) -> dict[str, Any]:
    found = await world.raw.get(world.path("agentdeployments", name))
    assert found is not None
    return found


async def set_image(world: World, name: str, image: str) -> None:
    await world.raw.patch(
        world.path("agentdeployments", name), {"spec": {"template": {"image": image}}}
    )


async def wait_phase(
    world: World, name: str, *phases: str, revision: int = 1, timeout: float = 240
) -> dict[str, Any]:
    """The AgentDeployment once its rollout of ``revision`` is in one of ``phases``."""

    seen: list[dict[str, Any]] = []

    async def reached() -> dict[str, Any] | None:
        body = await deployment(world, name)
        status = body.get("status") or {}
        seen[:] = [status]
        return (
            body if status.get("phase") in phases and status.get("revision") == revision else None
        )

    try:
        found: dict[str, Any] = await eventually(reached, timeout=timeout, every=0.3)
    except AssertionError:
        # Say where it stood: which step, what waits, the migrations' phases.
        moves = {
            m["metadata"]["name"]: (m.get("status") or {}).get("phase")
            for m in await world.raw.list(world.path("agentmigrations"))
        }
        raise AssertionError(
            f"{name} not {phases} at revision {revision}: {seen}; {moves}"
        ) from None
    return found


async def rollout_migrations(world: World, name: str) -> list[dict[str, Any]]:
    listed = await world.raw.list(world.path("agentmigrations"), labels={DEPLOYMENT_LABEL: name})
    return sorted(listed, key=lambda m: (m["metadata"]["creationTimestamp"], m["metadata"]["name"]))


def conditions(body: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in body["status"]["conditions"]}


async def images(world: World, sessions: list[str]) -> dict[str, str]:
    return {name: (await world.session(name))["status"].get("image") for name in sessions}


class Running:
    """Samples every migration's phase while a rollout goes: the most that ran at once,
    in the cluster and out of one node."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.most = 0
        self.most_per_node = 0
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            listed = await self.world.raw.list(self.world.path("agentmigrations"))
            running = [
                m
                for m in listed
                if (m.get("status") or {}).get("phase") not in (None, "Queued", *FINISHED)
            ]
            # A move counts against its session's node, as the pacing queue counts it (a
            # migration's status does not name its source node).
            sessions = await self.world.raw.list(self.world.path("agentsessions"))
            node_of = {
                s["metadata"]["name"]: (s.get("status") or {}).get("nodeName") for s in sessions
            }
            nodes = Counter(node_of.get(m["spec"]["sessionRef"]["name"]) for m in running)
            self.most = max(self.most, len(running))
            self.most_per_node = max(
                [self.most_per_node, *(n for node, n in nodes.items() if node is not None)]
            )
            await asyncio.sleep(0.1)

    async def __aenter__(self) -> Running:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def test_a_good_version_rolls_out_in_steps_within_the_caps_and_a_pinned_one_stays(
    fleet: World,
) -> None:
    world = fleet
    names = ["s1", "s2"]
    await world.apply(
        deployment_manifest("agent", "refagent:v1", steps=[{"canary": {"sessions": 1}}])
    )
    for name in names:
        await world.apply(follower(name, "agent"))
    await world.apply(follower("kept", "agent", pinned=True))
    for name in [*names, "kept"]:
        body = await world.wait_running(name, epoch=1, timeout=180)
        assert body["status"]["image"] == "refagent:v1"
    complete = await wait_phase(world, "agent", "Complete")
    assert complete["status"]["sessions"]["total"] == 3

    async with contextlib.AsyncExitStack() as stack:
        loads = [await stack.enter_async_context(Load(world, name, rate=5)) for name in names]
        for load in loads:
            await eventually(lambda load=load: load.load.replies, timeout=30)
        running = await stack.enter_async_context(Running(world))
        await set_image(world, "agent", "refagent:v2")
        body = await wait_phase(world, "agent", "Complete", revision=2, timeout=300)
        assert body["status"]["revision"] == 2
        for load in loads:
            assert await load.stop(), "some accepted messages were never answered"
        migrations = await rollout_migrations(world, "agent")
        for name, load in zip(names, loads, strict=True):
            own = [m for m in migrations if m["spec"]["sessionRef"]["name"] == name]
            assert invariants(load, own) == {}, name

    # Every session that may move runs v2, through one migration each; the pinned one
    # stays on v1 and was never moved.
    assert await images(world, names) == dict.fromkeys(names, "refagent:v2")
    assert (await world.session("kept"))["status"]["image"] == "refagent:v1"
    assert sorted(m["spec"]["sessionRef"]["name"] for m in migrations) == names
    assert all(m["status"]["result"] == "Succeeded" for m in migrations)
    assert all(m["spec"]["reason"] == "Rollout" for m in migrations)
    assert {m["metadata"]["labels"][REVISION_LABEL] for m in migrations} == {"2"}
    assert not [
        m
        for m in await world.raw.list(world.path("agentmigrations"))
        if m["spec"]["sessionRef"]["name"] == "kept"
    ]

    # Never more than the caps ran at once. (With a canary of one and one session after
    # it, the rollout's own steps never exceed the caps: nothing had to wait Queued.)
    # The sampler saw the moves on their nodes (one at a time there), or it proves nothing.
    assert running.most <= 2 and running.most_per_node == 1, (running.most, running.most_per_node)
    # The canary first, alone: the others were created after it had succeeded.
    canary, *rest = migrations
    assert all(
        m["metadata"]["creationTimestamp"] >= canary["status"]["completionTime"][:19] for m in rest
    )

    status = body["status"]
    assert status["targetImage"] == "refagent:v2" and status["stableImage"] == "refagent:v1"
    assert {v["image"]: v["sessions"] for v in status["versions"]} == {
        "refagent:v2": 2,
        "refagent:v1": 1,
    }
    assert status["sessions"]["updated"] == 2 and status["sessions"]["pinned"] == 1
    assert conditions(body) == {
        "Progressing": ("True", "RolloutComplete"),
        "Available": ("True", "SessionsServing"),
        "Halted": ("False", "WithinFailureBudget"),
    }
    said = [r for _, r, _ in await world.events("agent")]
    assert "RolloutStarted" in said and "MigrationsCreated" in said and "RolloutComplete" in said

    history = await plugin(world, "rollout", "history", "agent")
    assert history.exit_code == 0 and all(
        m["metadata"]["name"] in history.output for m in migrations
    )
    status_said = await plugin(world, "rollout", "status", "agent")
    assert status_said.exit_code == 0 and "Complete" in status_said.output


async def test_a_version_the_gate_rejects_halts_after_the_canary_and_the_rest_stay(
    fleet: World,
) -> None:
    world = fleet
    names = ["g1", "g2"]
    await world.apply(
        deployment_manifest(
            "gated",
            "refagent:v2",
            migration={"validation": GATE},
            steps=[{"canary": {"sessions": 1}}],
        )
    )
    for name in names:
        await world.apply(follower(name, "gated"))
    for name in names:
        await world.wait_running(name, epoch=1, timeout=180)
    await wait_phase(world, "gated", "Complete")

    async with contextlib.AsyncExitStack() as stack:
        loads = [
            await stack.enter_async_context(Load(world, name, rate=3, message=ASK))
            for name in names
        ]
        for load in loads:
            await eventually(lambda load=load: load.load.replies, timeout=30)
        await set_image(world, "gated", "refagent:v2-forgetful")
        body = await wait_phase(world, "gated", "Halted", revision=2, timeout=300)
        await asyncio.sleep(2)  # a few more passes: nothing else starts
        for load in loads:
            assert await load.stop(), "some accepted messages were never answered"

    migrations = await rollout_migrations(world, "gated")
    assert len(migrations) == 1, [m["metadata"]["name"] for m in migrations]
    canary = migrations[0]
    assert canary["status"]["result"] == "RolledBack"
    status = body["status"]
    assert conditions(body)["Halted"] == ("True", "GateRejected")
    assert conditions(body)["Progressing"] == ("False", "RolloutHalted")
    assert status["gateVerdicts"]["rejected"] == 1
    rejected = status["gateVerdicts"]["recentRejections"][0]
    assert rejected["session"] == canary["spec"]["sessionRef"]["name"]
    assert status["halt"]["reason"] == "GateRejected"
    assert canary["spec"]["sessionRef"]["name"] in status["message"]
    # Every session still runs v2 and serves; the one past the canary was never touched.
    assert await images(world, names) == dict.fromkeys(names, "refagent:v2")
    for name in names:
        await world.wait_running(name)
    warnings = [r for t, r, _ in await world.events("gated") if t == "Warning"]
    assert "RolloutHalted" in warnings
    halted = await plugin(world, "rollout", "status", "gated")
    assert halted.exit_code == 1 and "GateRejected" in halted.output


async def test_abort_moves_the_canary_back_live(fleet: World) -> None:
    """v2 to v2-b (v2's program under another tag): a move back must be one the gates
    allow. From v2 back to v1 is not — v1 cannot read the state schema v2 writes — and
    the engine refuses it (IncompatibleStateSchema), rightly: the session stays on v2."""
    world = fleet
    names = ["a1", "a2"]
    await world.apply(
        deployment_manifest(
            "back", "refagent:v2", steps=[{"canary": {"sessions": 1}}, {"pause": {}}]
        )
    )
    for name in names:
        await world.apply(follower(name, "back"))
    for name in names:
        await world.wait_running(name, epoch=1, timeout=180)
    await wait_phase(world, "back", "Complete")

    await set_image(world, "back", "refagent:v2-b")
    paused = await wait_phase(world, "back", "Paused", revision=2)
    assert paused["status"]["sessions"]["updated"] == 1
    [forward] = await rollout_migrations(world, "back")
    canary = forward["spec"]["sessionRef"]["name"]
    assert (await world.session(canary))["status"]["image"] == "refagent:v2-b"

    async with Load(world, canary, rate=5) as load:
        await eventually(lambda: load.load.replies, timeout=30)
        aborted = await plugin(world, "rollout", "abort", "back")
        assert aborted.exit_code == 0, aborted.output
        body = await wait_phase(world, "back", "Aborted", revision=2, timeout=240)
        assert await load.stop(), "some accepted messages were never answered"
        migrations = await rollout_migrations(world, "back")
        assert invariants(load, migrations) == {}

    back = [m for m in migrations if m["spec"]["target"]["image"] == "refagent:v2"]
    assert [m["spec"]["sessionRef"]["name"] for m in back] == [canary]
    assert back[0]["status"]["result"] == "Succeeded"
    assert await images(world, names) == dict.fromkeys(names, "refagent:v2")
    assert conditions(body)["Progressing"] == ("False", "RolloutAborted")
    assert "RolloutAborting" in [r for t, r, _ in await world.events("back") if t == "Warning"]


async def test_an_operator_restarted_mid_rollout_carries_it_on(fleet: World) -> None:
    world = fleet
    names = ["r1", "r2", "r3"]
    await world.apply(deployment_manifest("again", "refagent:v1"))
    for name in names:
        await world.apply(follower(name, "again"))
    for name in names:
        await world.wait_running(name, epoch=1, timeout=180)
    await wait_phase(world, "again", "Complete")

    await set_image(world, "again", "refagent:v2")

    async def some_moved() -> bool:
        done = [
            m
            for m in await rollout_migrations(world, "again")
            if (m.get("status") or {}).get("result") == "Succeeded"
        ]
        return bool(done)

    await eventually(some_moved, timeout=180, every=0.2)
    await world.stop_operator()
    stopped_at = await deployment(world, "again")
    assert stopped_at["status"]["phase"] == "Progressing"
    assert stopped_at["status"]["sessions"]["updated"] < len(names)
    await world.start_operator()

    body = await wait_phase(world, "again", "Complete", revision=2, timeout=300)
    assert body["status"]["revision"] == stopped_at["status"]["revision"]
    assert await images(world, names) == dict.fromkeys(names, "refagent:v2")
    migrations = await rollout_migrations(world, "again")
    # One migration per session, none made twice by the restarted operator.
    assert sorted(m["spec"]["sessionRef"]["name"] for m in migrations) == names
    assert all(m["status"]["result"] == "Succeeded" for m in migrations)


def _readme_block() -> list[list[str]]:
    """The commands of the README's "Fleet upgrades" block, as a shell splits them."""
    text = (REPO / README).read_text()
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n#", 1)[0]
    [block] = re.findall(r"^```sh\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    return [c for line in block.splitlines() if (c := shlex.split(line, comments=True))]


async def test_the_readmes_fleet_upgrade_block_does_what_it_says(fleet: World) -> None:
    """Each line carried out through the API as kubectl would (no kubectl binary speaks
    to the emulator), the plugin's lines by the plugin itself: a line of another shape
    fails the test, so the block cannot grow a command this does not run."""
    world = fleet
    said: dict[str, str] = {}
    followers = ["support-1", "support-2", "support-3"]
    # The users' traffic the block's canary is judged on (README: "with your users'
    # messages flowing"): it starts once the followers serve, as a user's would.
    traffic = contextlib.AsyncExitStack()
    loads: list[Load] = []
    async with traffic:
        await _carry_out_readme_block(world, said, traffic, loads, followers)
        for load in loads:
            assert await load.stop(), "some accepted messages were never answered"
    # What the block's comments say: the canary moved to v2 and the rest waited; the
    # status named the step and the versions; history lists the canary's migration.
    shown = await images(world, followers)
    assert sorted(shown.values()).count("shadowpod-refagent:v2") >= 1, shown
    assert "Paused" in said["status"] and "shadowpod-refagent:v2" in said["status"]
    made = await rollout_migrations(world, "support")
    assert made and all(m["metadata"]["name"] in said["history"] for m in made)
    for name, load in zip(followers, loads, strict=True):
        own = [m for m in made if m["spec"]["sessionRef"]["name"] == name]
        assert invariants(load, own) == {}, name
    body = await deployment(world, "support")
    assert body["status"]["revision"] == 2 and not body["spec"].get("paused")


def _answered(load: Load) -> Callable[[], int]:
    return lambda: len(load.load.replies)


async def _carry_out_readme_block(
    world: World,
    said: dict[str, str],
    traffic: contextlib.AsyncExitStack,
    loads: list[Load],
    followers: list[str],
) -> None:
    for command in _readme_block():
        match command:
            case ["kubectl", "apply", "-f", path]:
                for manifest in yaml.safe_load_all((REPO / path).read_text()):
                    await world.apply(manifest)
            case ["kubectl", "wait", wanted, target, timeout] if wanted.startswith("--for="):
                kind, _, name = target.partition("/")
                assert kind == "agd" and timeout.startswith("--timeout=")
                phase = wanted.removeprefix("--for=jsonpath={.status.phase}=")
                assert phase != wanted, f"README: cannot carry out {command}"
                seconds = float(timeout.removeprefix("--timeout=").removesuffix("s"))

                seen: list[dict[str, Any]] = []

                async def reached(
                    name: str = name, phase: str = phase, seen: list[dict[str, Any]] = seen
                ) -> bool:
                    seen[:] = [(await deployment(world, name)).get("status") or {}]
                    return seen[0].get("phase") == phase

                try:
                    await eventually(reached, timeout=seconds, every=0.3)
                except AssertionError:
                    raise AssertionError(f"README: {command}: {seen}") from None
                if phase == "Complete" and not loads:
                    for name in followers:
                        loads.append(await traffic.enter_async_context(Load(world, name, rate=5)))
                    for load in loads:
                        await eventually(_answered(load), timeout=30)
            case ["kubectl", "patch", "agd", name, "--type", "merge", "-p", patch]:
                await world.raw.patch(world.path("agentdeployments", name), json.loads(patch))
            case ["kubectl", "shadowpod", "rollout", verb, name]:
                result = await plugin(world, "rollout", verb, name)
                assert result.exit_code == 0, (command, result.output)
                said[verb] = result.output
            case _:
                raise AssertionError(f"README: a command this test does not run: {command}")
