"""Upgrade gates under the operator: the shadow pod answers in its sandbox, the judge
compares, and the migration fences or rolls back — with the reference agent's
regressing version (``refagent:v2-forgetful``), its reworded one
(``refagent:v2-reworded``), a golden session in a ConfigMap, and a policy that cannot
run. The semantic model loads once per test process (~7 s, the first comparison)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from shadowpod.client.gateway import GatewayClient
from shadowpod.client.goldens import earliest_recordable_seq, record_golden
from shadowpod.kube import names
from shadowpod.kube.models.v1alpha1 import API_VERSION
from shadowpod.local.load import Reply
from tests.gates.test_llm import KEY, ChatServer, chat_server  # noqa: F401 - a fixture
from tests.kube.operator_world import (
    NAME,
    Load,
    World,
    bump,
    invariants,
    plugin,
    session_manifest,
)
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(300)

# Four live turns, by the semantic judge: 90% of them must agree.
GATE: dict[str, Any] = {"turns": 4, "timeoutSeconds": 60, "gate": {"judge": "Semantic"}}
# What the client keeps saying: every other message asks for the name the session knows.
ASK = lambda n: "what is my name?" if n % 2 == 0 else f"message {n}"  # noqa: E731
SERVING = frozenset({"lost", "duplicated", "reordered"})


def manual_migration(name: str, session: str, image: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentMigration",
        "metadata": {"name": name},
        "spec": {"sessionRef": {"name": session}, "target": {"image": image}, **spec},
    }


def failed_reason(migration: dict[str, Any]) -> str:
    conditions = migration["status"]["conditions"]
    return next(c["reason"] for c in conditions if c["type"] == "Failed" and c["status"] == "True")


async def reasons(world: World, name: str) -> set[str]:
    return {reason for kind, reason, _ in await world.events(name) if kind == "Warning"}


def replies(load: Load) -> list[Reply]:
    return [reply for per_turn in load.load.replies.values() for reply in per_turn]


def sample(world: World, metric: str, **labels: str) -> float:
    value = world.metrics.registry.get_sample_value(metric, labels)
    return 0.0 if value is None else value


async def test_a_regressing_version_is_rolled_back_and_a_reworded_one_goes_through(
    world: World,
) -> None:
    await world.apply(session_manifest("g1", image="refagent:v2", migration={"validation": GATE}))
    body = await world.wait_running("g1", epoch=1)
    source = body["status"]["ownerPod"]

    # 1. Shadow compare catches the version that forgets the user's name, while a client
    # talks: rolled back, the old owner served throughout, nothing lost or doubled.
    async with Load(world, "g1", rate=3, message=ASK) as load:
        await eventually(lambda: load.load.replies, timeout=30)
        forgetful = await bump(world, "g1", "refagent:v2-forgetful")
        migration = await world.wait_finished(forgetful)
        assert await load.stop(), "some accepted messages were never answered"
        broken = invariants(load, [migration], SERVING)
    assert broken == {}
    status = migration["status"]
    assert status["result"] == "RolledBack", status.get("message")
    assert failed_reason(migration) == "ValidationFailed"
    assert "Validating" in [p["phase"] for p in status["phases"]]
    verdict = status["validation"]
    assert verdict["judge"] == "semantic" and not verdict["passed"]
    assert verdict["compared"] >= 4 and verdict["agreed"] < verdict["compared"]
    assert verdict["thresholdPercent"] == 90
    assert verdict["agreementPercent"] == verdict["agreed"] * 100 // verdict["compared"]
    worst = verdict["worst"][0]
    assert worst["seq"] > verdict["fromSeq"] and "similarity" in worst["reason"]
    assert verdict["answers"] == names.validation_answers(forgetful)
    assert "ValidationFailed" in await reasons(world, forgetful)
    assert "ValidationFailed" in await reasons(world, "g1")
    body = await world.wait_running("g1", epoch=1)
    assert body["status"]["ownerPod"] == source and body["status"]["image"] == "refagent:v2"
    assert [p["metadata"]["name"] for p in await world.pods("g1")] == [source]
    # The old version still knows the name.
    assert any(f"your name is {NAME}" in r.content for r in replies(load))

    # `kubectl shadowpod diff` shows both answers to the turn the judge liked least.
    shown = await plugin(world, "diff", forgetful)
    assert shown.exit_code == 1, shown.output
    assert f"your name is {NAME}" in shown.output and "I do not know your name yet" in shown.output
    as_json = await plugin(world, "diff", forgetful, "--json")
    assert as_json.exit_code == 1
    turns = {t["seq"]: t for t in json.loads(as_json.output)["comparisons"][0]["turns"]}
    assert f"your name is {NAME}" in turns[worst["seq"]]["old"]
    assert "I do not know your name yet" in turns[worst["seq"]]["new"]
    assert not turns[worst["seq"]]["agreed"]

    assert (
        sample(
            world, "shadowpod_migrations_rolled_back_by_validation_total", reason="ValidationFailed"
        )
        == 1
    )
    assert (
        sample(world, "shadowpod_validation_turns_compared_total", judge="semantic", source="live")
        == verdict["compared"]
    )
    assert sample(world, "shadowpod_validation_agreement_ratio_count", source="live") == 1

    # 2. A golden session of this conversation, in a ConfigMap: the forgetful version
    # fails it too (no live turn needed); a golden that is not there cannot be judged.
    async with GatewayClient(world.gateway.url, world.gateway.control_token) as admin:
        # Turns the journal still holds (retention removed those behind the oldest kept
        # snapshot, which holds the name given): the name asked for, a few messages.
        first = await earliest_recordable_seq(admin, world.gateway_session("g1"))
        golden = await record_golden(
            admin,
            world.gateway_session("g1"),
            from_seq=first,
            to_seq=first + 23,
            note="name recall",
        )
    await world.raw.create(
        world.path("configmaps"),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "goldens"},
            "data": {"g1.jsonl": golden.dumps()},
        },
    )
    goldens_only = {"turns": 0, "goldens": [{"configMap": "goldens", "key": "g1.jsonl"}]}
    await world.apply(
        manual_migration("g1-golden", "g1", "refagent:v2-forgetful", validation=goldens_only)
    )
    migration = await world.wait_finished("g1-golden")
    assert failed_reason(migration) == "ValidationFailed", migration["status"].get("message")
    found = migration["status"]["validation"]["goldens"]
    assert found == [
        {
            "golden": "goldens/g1.jsonl",
            "compared": found[0]["compared"],
            "agreed": found[0]["agreed"],
            "passed": False,
        }
    ]
    assert "goldens/g1.jsonl" in migration["status"]["message"]

    missing = {"turns": 0, "goldens": [{"configMap": "goldens", "key": "nope.jsonl"}]}
    await world.apply(
        manual_migration("g1-nogolden", "g1", "refagent:v2-forgetful", validation=missing)
    )
    migration = await world.wait_finished("g1-nogolden")
    assert failed_reason(migration) == "ValidationUnavailable"
    assert "has no key 'nope.jsonl'" in migration["status"]["message"]
    assert "ValidationUnavailable" in await reasons(world, "g1-nogolden")
    assert (
        sample(
            world,
            "shadowpod_migrations_rolled_back_by_validation_total",
            reason="ValidationUnavailable",
        )
        == 1
    )

    # 3. The reworded version says the same in other words: the semantic judge lets it
    # through, and it serves.
    async with Load(world, "g1", rate=3, message=ASK, prefix="again") as load:
        await eventually(lambda: load.load.replies, timeout=30)
        reworded = await bump(world, "g1", "refagent:v2-reworded")
        migration = await world.wait_finished(reworded)
        body = await world.wait_settled("g1", epoch=2)
        assert await load.stop()
        broken = invariants(load, [migration], SERVING)
    assert broken == {}
    status = migration["status"]
    assert status["result"] == "Succeeded", status.get("message")
    assert status["validation"]["passed"] and status["validation"]["compared"] >= 4
    assert body["status"]["image"] == "refagent:v2-reworded"
    assert any(f"you are {NAME}" in r.content for r in replies(load))
    shown = await plugin(world, "diff", reworded)
    assert shown.exit_code == 0, shown.output
    assert f"you are {NAME}" in shown.output
    assert sample(world, "shadowpod_validation_agreement_ratio_count", source="live") == 2


async def test_a_validation_policy_the_gate_cannot_use_is_said_and_starts_nothing(
    world: World,
) -> None:
    bad = {
        "turns": 2,
        "gate": {
            "judge": "LLM",
            "nondeterministic": ["order #(\\d+"],
            "llm": {
                "url": "http://127.0.0.1:9/v1",
                "model": "judge",
                "apiKeySecretRef": {"name": "no-such-secret", "key": "key"},
            },
        },
    }
    await world.apply(session_manifest("g2", image="refagent:v2", migration={"validation": bad}))
    body = await world.wait_running("g2", epoch=1)
    owner = body["status"]["ownerPod"]

    async def degraded(generation: int) -> dict[str, Any] | None:
        conditions = (await world.session("g2"))["status"]["conditions"]
        found = [c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"]
        if found and found[0].get("observedGeneration") == generation:
            return found[0]
        return None

    condition = await eventually(lambda: degraded(1), timeout=30)
    assert condition["reason"] == "InvalidValidationPolicy"
    assert "nondeterministic" in condition["message"]
    assert "Secret 'no-such-secret'" in condition["message"]
    assert "InvalidValidationPolicy" in await reasons(world, "g2")

    # An image change waits for a policy that can run: no migration, the owner serves on.
    patched = await world.raw.patch(
        world.path("agentsessions", "g2"), {"spec": {"image": "refagent:v2-reworded"}}
    )
    assert patched is not None
    await eventually(lambda: degraded(patched["metadata"]["generation"]), timeout=30)
    wanted = names.image_migration("g2", patched["metadata"]["generation"])
    assert await world.migration(wanted) is None

    # A migration with a policy of its own that cannot run: refused at once, said why.
    own = {"turns": 2, "gate": {"nondeterministic": ["receipt (r-"]}}
    await world.apply(manual_migration("g2-bad", "g2", "refagent:v2-reworded", validation=own))
    migration = await world.wait_finished("g2-bad")
    assert migration["status"]["result"] == "Failed"
    assert failed_reason(migration) == "InvalidValidationPolicy"
    assert "spec.validation.gate" in migration["status"]["message"]
    assert "InvalidValidationPolicy" in await reasons(world, "g2-bad")
    assert [p["metadata"]["name"] for p in await world.pods("g2")] == [owner]

    # Nothing was compared: `kubectl shadowpod diff` says so, as it does of a typo.
    nothing = await plugin(world, "diff", "g2-bad")
    assert nothing.exit_code == 2 and "compared no answers" in nothing.output
    unknown = await plugin(world, "diff", "g2-nope")
    assert unknown.exit_code == 2 and "AgentMigration 'g2-nope' not found" in unknown.output


async def test_a_version_that_forgets_who_it_is_is_rolled_back_by_the_persona_check(
    world: World,
) -> None:
    persona = {"judge": "Semantic", "onDrift": "Rollback"}
    await world.apply(session_manifest("g3", image="refagent:v2", migration={"persona": persona}))
    body = await world.wait_running("g3", epoch=1)
    renamed = await bump(world, "g3", "refagent:v2-renamed")  # calls itself Rex
    migration = await world.wait_finished(renamed)
    status = migration["status"]
    assert status["result"] == "RolledBack", status.get("message")
    assert failed_reason(migration) == "PersonaDrift"
    [probe] = status["persona"]
    assert probe["stage"] == "restore" and probe["drifted"]
    assert probe["instance"] == status["target"]["pod"]
    assert "PersonaDrift" in await reasons(world, renamed)
    assert "PersonaDrift" in await reasons(world, "g3")
    assert (await world.wait_running("g3", epoch=1))["status"]["ownerPod"] == body["status"][
        "ownerPod"
    ]
    assert (
        sample(world, "shadowpod_migrations_rolled_back_by_validation_total", reason="PersonaDrift")
        == 1
    )


async def test_a_drift_the_policy_only_warns_of_is_said_at_both_probes_and_the_move_goes_on(
    world: World,
) -> None:
    persona = {"judge": "Semantic", "onDrift": "Warn"}
    await world.apply(session_manifest("g5", image="refagent:v2", migration={"persona": persona}))
    await world.wait_running("g5", epoch=1)
    renamed = await bump(world, "g5", "refagent:v2-renamed")  # calls itself Rex
    migration = await world.wait_finished(renamed)
    status = migration["status"]
    assert status["result"] == "Succeeded", status.get("message")
    # Probed after its restore and again once it owned the session: both drifted, both
    # only warned of — after the fence with no way back said so.
    restore, promotion = status["persona"]
    assert (restore["stage"], restore["drifted"], restore["action"]) == ("restore", True, "warned")
    assert promotion["stage"] == "promotion" and promotion["drifted"]
    assert promotion["action"].startswith("warned") and "no way back" in promotion["action"]
    assert "PersonaDrift" in await reasons(world, "g5")
    body = await world.wait_running("g5", epoch=2)
    assert body["status"]["ownerPod"] == status["target"]["pod"]
    assert (
        sample(world, "shadowpod_migrations_rolled_back_by_validation_total", reason="PersonaDrift")
        == 0
    )


async def test_the_llm_judge_reads_its_key_from_the_secret_the_policy_names(
    world: World,
    chat_server: ChatServer,  # noqa: F811 - the fixture imported above
) -> None:
    await world.raw.create(
        world.path("secrets"),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "judge"},
            "data": {"api-key": base64.b64encode(KEY.encode()).decode()},
        },
    )
    llm = {
        "url": chat_server.url,
        "model": "judge-small",
        "apiKeySecretRef": {"name": "judge", "key": "api-key"},
    }
    gate = {"turns": 2, "gate": {"judge": "LLM", "agreementPercent": 100, "llm": llm}}
    await world.apply(session_manifest("g4", image="refagent:v2", migration={"validation": gate}))
    await world.wait_running("g4", epoch=1)
    async with Load(world, "g4", rate=3, message=ASK) as load:
        await eventually(lambda: load.load.replies, timeout=30)
        forgetful = await bump(world, "g4", "refagent:v2-forgetful")
        migration = await world.wait_finished(forgetful)
        assert await load.stop()
    # The endpoint was asked with the Secret's key (it answers 401 to any other), and
    # its model found the name missing.
    assert chat_server.requests, migration["status"].get("message")
    assert failed_reason(migration) == "ValidationFailed", migration["status"].get("message")
    verdict = migration["status"]["validation"]
    assert verdict["judge"] == "llm" and "forgets ['Ada']" in verdict["worst"][0]["reason"]
    # Neither the record nor the status holds the key: they name the Secret.
    assert KEY not in json.dumps(migration)
