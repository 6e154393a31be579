"""The operator's idle cost does not grow with its sessions (issue 28).

Steady sessions have no periodic pass of their own: the operator learns of changes
from watch events, the gateway's wake feed, and one read of every session's position
per period (``kube/positions.py``). Counted here: the requests the operator itself
makes to the API server and to the gateway while nothing changes, with few sessions
and with more (Kopf's watch streams, re-opened every minute whatever the number of
sessions, are not the operator's requests and are not counted).

On the emulator, with the kubelet stand-in's "no process" pods (Running and Ready at
once, nothing in them): what is measured is the operator, and six agent processes
starting at once on this shared 2-core machine would be measured instead."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from shadowpod.api.models import SessionPosition
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.ownership import FenceState
from shadowpod.kube import sessions
from shadowpod.kube.models.v1alpha1 import JournalStatus
from shadowpod.kube.models.v1alpha1.session import MigrationSummary
from shadowpod.kube.positions import differences
from tests.kube.operator_world import World, session_manifest
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(300)
# Long enough for several periods of the world's operator (0.5 s).
WINDOW_S = 4.0


@pytest.fixture
def world(processless_world: World) -> World:
    return processless_world


def _steady(body: dict[str, object]) -> bool:
    status = body.get("status") or {}
    assert isinstance(status, dict)
    state = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return (
        status.get("phase") == "Running"
        and state.get("Ready") == "True"
        and state.get("Degraded") == "False"
        and not status.get("activeMigration")
        and (status.get("journal") or {}).get("headSeq") is not None
    )


async def _idle_requests(world: World, sessions: list[str]) -> tuple[int, int]:
    """The requests (API server, gateway) the operator makes in ``WINDOW_S`` while the
    ``sessions``, all Running, are left alone."""
    for name in sessions:
        await world.wait_running(name, timeout=120)

    async def all_steady() -> bool | None:
        return all([_steady(await world.session(n)) for n in sessions]) or None

    await eventually(all_steady, timeout=60, every=0.5)
    await asyncio.sleep(2 * world.config().reconcile_interval_s)  # passes in flight end
    assert world.memo is not None
    ctx = world.memo.context
    api, gateway = ctx.api.requests, ctx.admin.requests
    await asyncio.sleep(WINDOW_S)
    return ctx.api.requests - api, ctx.admin.requests - gateway


async def test_the_operators_idle_requests_do_not_grow_with_its_sessions(world: World) -> None:
    few = [f"idle-{n}" for n in range(2)]
    for name in few:
        await world.apply(session_manifest(name))
    api_few, gateway_few = await _idle_requests(world, few)

    more = few + [f"idle-{n}" for n in range(2, 6)]
    for name in more[len(few) :]:
        await world.apply(session_manifest(name))
    api_more, gateway_more = await _idle_requests(world, more)

    periods = WINDOW_S / world.config().reconcile_interval_s
    # One read of every session's position per period, and the wake long-poll: the
    # same with six sessions as with two (each of them, polled, costs 2 gateway and
    # 3 API requests a period).
    assert gateway_few <= periods + 2, gateway_few
    assert gateway_more <= gateway_few + 2, (gateway_few, gateway_more)
    assert api_few <= 2, api_few
    assert api_more <= api_few + 2, (api_few, api_more)


async def test_a_journal_that_moves_shows_in_a_steady_sessions_status(world: World) -> None:
    await world.apply(session_manifest("moving"))
    body = await world.wait_running("moving")
    gid = world.gateway_session("moving")
    async with GatewayClient(world.gateway.url) as client:
        await client.post_message(gid, "hello", id="hello")
        await client.post_message(gid, "again", id="again")

    async def shown() -> dict[str, int] | None:
        async with GatewayClient(world.gateway.url, world.gateway.control_token) as admin:
            journal = await admin.status(gid)
        acked = min(journal.head, max(journal.acks.values(), default=0))
        status = (await world.session("moving")).get("status") or {}
        figures = status.get("journal") or {}
        wanted = {"headSeq": journal.head, "ackedSeq": acked}
        return figures if journal.head >= 2 and figures == wanted else None

    figures = await eventually(shown, timeout=30, every=0.3)
    assert figures["headSeq"] > (body["status"].get("journal") or {}).get("headSeq", 0)


def test_a_look_at_the_positions_writes_moved_journals_and_passes_over_disagreements() -> None:
    def status(epoch: int | None, head: int, phase: str = "Running") -> dict[str, object]:
        return {"epoch": epoch, "phase": phase, "journal": {"headSeq": head, "ackedSeq": 0}}

    def at(name: str, head: int, epoch: int = 1, fence: str = "open") -> SessionPosition:
        return SessionPosition(
            session=f"ns.{name}", head=head, acked=0, epoch=epoch, fence=FenceState(fence)
        )

    watched = {
        ("ns", "still"): status(1, 5),
        ("ns", "moved"): status(1, 5),
        ("ns", "new-epoch"): status(1, 5),
        ("ns", "woken"): status(1, 5, "Suspended"),
        ("ns", "asleep"): status(1, 5, "Suspended"),
        ("ns", "unmade"): status(None, 0),
        ("ns", "lost"): status(1, 5),
    }
    positions = [
        at("still", 5),
        at("moved", 9),
        at("new-epoch", 5, epoch=2),
        at("woken", 5, fence="waking"),
        at("asleep", 5, fence="suspended"),
        at("other-namespaces-session", 3),
    ]
    found = differences(watched, positions)
    assert found.journals == {("ns", "moved"): JournalStatus(head_seq=9, acked_seq=0)}
    assert sorted(found.passes) == [("ns", "lost"), ("ns", "new-epoch"), ("ns", "woken")]


def _session_after(seen: sessions.Observed) -> dict[str, Any]:
    """A session's body with the status the operator writes for ``seen``."""
    body: dict[str, Any] = {
        "apiVersion": "shadowpod.dev/v1alpha1",
        "kind": "AgentSession",
        "metadata": {"name": "s1", "namespace": "default", "generation": 3},
        "spec": {"image": "refagent:v1"},
    }
    body["status"] = sessions.status_patch(sessions.session_status(body, seen))["status"]
    return body


def test_a_session_whose_last_move_was_rolled_back_keeps_no_periodic_pass() -> None:
    # Run on the real API server: 100 sessions bumped to an image no node has, each
    # move rolled back, the image put back: each kept a pass every period, for ever
    # (after a rollout failed everywhere, an idle cost that grows with sessions).
    rolled_back = MigrationSummary(name="s1-g2", result="RolledBack", reason="PhaseTimeout")
    steady = sessions.Observed(
        phase="Running", epoch=2, owner="s1-x", ready=True, image="refagent:v1", last=rolled_back
    )
    body = _session_after(steady)
    assert {c["type"]: c["status"] for c in body["status"]["conditions"]}["Degraded"] == "True"
    assert not sessions.needs_passes(body)
    # Degraded by what a pass re-checks (a missing Secret): the passes go on.
    missing = sessions.Problem("SecretNotFound", "credential 'mail' refers to Secret 'x'")
    assert sessions.needs_passes(_session_after(replace(steady, degraded=missing)))
