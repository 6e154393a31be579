"""AgentDeployment's model: its strategy is the planner's, its status keeps the planner's
state across an operator restart, and what it writes the API server admits."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowpod.fleet.followers import FailureKind, Follower, Outcome, Verdict
from shadowpod.fleet.planner import plan
from shadowpod.fleet.progress import conditions
from shadowpod.fleet.state import Control, Failure, Halt, RolloutState
from shadowpod.fleet.strategy import Canary, Pace, Pause, RolloutStrategy, StrategyError
from shadowpod.kube.conditions import set_condition
from shadowpod.kube.models.v1alpha1 import (
    AgentDeployment,
    AgentDeploymentStatus,
    AgentSession,
    DeploymentCondition,
)
from tests.kube.test_crds_cel import admit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "02-kubernetes"


def example() -> AgentDeployment:
    return AgentDeployment.model_validate(
        yaml.safe_load((EXAMPLES / "agentdeployment.yaml").read_text())
    )


def test_the_examples_strategy_is_the_planners() -> None:
    assert example().spec.strategy.to_strategy() == RolloutStrategy(
        steps=(Canary(sessions=1), Pause(), Canary(percent=25), Pause(seconds=600)),
        pace=Pace(max_concurrent=10, max_per_node=2, max_unavailable=0),
        failure_budget=1,
    )


def test_what_the_api_server_cannot_check_the_conversion_says() -> None:
    """A shrinking canary passes the CRD (CEL cannot compare list items cheaply); the
    operator reports the conversion's message as a condition."""
    manifest = yaml.safe_load((EXAMPLES / "agentdeployment.yaml").read_text())
    manifest["spec"]["strategy"]["steps"] = [
        {"canary": {"percent": 50}},
        {"canary": {"percent": 10}},
    ]
    assert admit(manifest) == []
    with pytest.raises(StrategyError, match=r"step 1 \(canary 10%\) is smaller than"):
        AgentDeployment.model_validate(manifest).spec.strategy.to_strategy()


def test_a_session_names_its_deployment_and_may_be_pinned() -> None:
    manifest = yaml.safe_load((EXAMPLES / "agentsession.yaml").read_text())
    manifest["spec"]["deploymentRef"] = {"name": "support"}
    manifest["spec"]["pinned"] = True
    session = AgentSession.model_validate(manifest)
    assert session.spec.deployment_ref is not None
    assert session.spec.deployment_ref.name == "support"
    assert session.spec.pinned
    assert (
        AgentSession.model_validate(
            yaml.safe_load((EXAMPLES / "agentsession.yaml").read_text())
        ).spec.pinned
        is False
    )


seconds = st.integers(1_700_000_000, 1_900_000_000).map(float)
names = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
failures = st.builds(
    Failure,
    session=names,
    migration=names,
    step=st.integers(0, 10),
    kind=st.sampled_from(FailureKind),
    message=st.text(max_size=50),
    aborting=st.booleans(),
)
states = st.builds(
    RolloutState,
    revision=st.integers(0, 1000),
    target=st.one_of(st.none(), names),
    stable=st.one_of(st.none(), names),
    step=st.integers(0, 10),
    started_at=st.one_of(st.none(), seconds),
    step_started_at=st.one_of(st.none(), seconds),
    completed_at=st.one_of(st.none(), seconds),
    failures=st.lists(failures, max_size=8).map(tuple),
    forgiven=st.integers(0, 8),
    resumes_seen=st.integers(0, 5),
    halted=st.one_of(
        st.none(),
        st.builds(
            Halt,
            step=st.integers(0, 10),
            reason=st.sampled_from(FailureKind),
            message=st.text(max_size=80),
            at=seconds,
        ),
    ),
    aborted=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(state=states)
def test_the_status_gives_the_planner_back_its_state(state: RolloutState) -> None:
    """What an operator restarted mid-rollout reads back is what it stored."""
    progress = plan(
        state.target or "agent:2",
        [Follower("s", "agent:1", node="n")],
        RolloutStrategy(),
        state,
        Control(),
        1_800_000_000.0,
    ).progress
    status = AgentDeploymentStatus.of(state, progress, [], generation=3)
    stored = AgentDeploymentStatus.model_validate(status.to_kube())
    assert stored.rollout_state() == state


def test_a_planned_status_is_admitted_by_the_crd() -> None:
    deployment = example()
    followers = [Follower(f"s{i}", "refagent:v1", node=f"n{i % 3}") for i in range(8)] + [
        Follower(
            "bad",
            "refagent:v1",
            node="n0",
            last=Outcome(
                "bad-r1",
                "refagent:v2",
                False,
                1_800_000_000.0,
                3.0,
                1,
                "ValidationFailed",
                "agreement 40% < 80%",
                Verdict(False, "exact", 0.4, "agreement 40% < 80%"),
            ),
        )
    ]
    strategy = deployment.spec.strategy.to_strategy()
    first = plan("refagent:v2", followers, strategy, RolloutState(), Control(), 1_800_000_000.0)
    decided = plan("refagent:v2", followers, strategy, first.state, Control(), 1_800_000_001.0)
    conditions_now: list[DeploymentCondition] = []
    for value in conditions(decided.progress, decided.state, strategy.pace.max_unavailable):
        conditions_now = set_condition(
            conditions_now,
            DeploymentCondition,
            value.type,
            value.status,
            value.reason,
            value.message,
            generation=1,
        )
    status = AgentDeploymentStatus.of(decided.state, decided.progress, conditions_now, 1)
    manifest = deployment.to_kube()
    manifest["status"] = status.to_kube()
    assert admit(manifest) == []
    assert manifest["status"]["gateVerdicts"]["rejected"] == 1
    assert {c["type"] for c in manifest["status"]["conditions"]} == {
        "Progressing",
        "Available",
        "Halted",
    }
