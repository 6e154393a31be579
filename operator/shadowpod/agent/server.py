"""The agent's own HTTP endpoints: health, readiness, status, state, snapshot and
checkpoint on request."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from shadowpod.agent.runtime import AgentRuntime, CheckpointRefused
from shadowpod.api.agent import (
    AgentStatus,
    CatchUpReport,
    CheckpointReport,
    CheckpointRequest,
    PromotionReport,
)
from shadowpod.domain.schema import dump_state

RUNTIME = web.AppKey("runtime", AgentRuntime)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def status_of(runtime: AgentRuntime) -> AgentStatus:
    state = runtime.folder.peek()
    catchup = runtime.catchup
    promotion = runtime.promotion
    return AgentStatus(
        agent=runtime.agent.name,
        version=runtime.agent.version,
        state_schema=runtime.agent.state_schema,
        reads_state_schemas=runtime.agent.reads_state_schemas,
        session=runtime.identity.session,
        instance=runtime.identity.instance,
        mode=runtime.mode,
        ready=runtime.ready,
        serving=runtime.serving,
        epoch=runtime.epoch,
        watermark=state.watermark,
        pending=len(state.pending),
        turns=runtime.turns,
        warmed=runtime.warmed,
        processes=runtime.processes.inventory(),
        catchup=None
        if catchup is None
        else CatchUpReport(
            entries=catchup.entries,
            seconds=round(catchup.seconds, 6),
            entries_per_s=round(catchup.entries_per_s),
        ),
        promotion=None
        if promotion is None
        else PromotionReport(
            epoch=promotion.epoch,
            fence_seq=promotion.fence_seq,
            at=promotion.at,
            first_turn=promotion.first_turn,
            first_turn_at=promotion.first_turn_at,
        ),
        drained=runtime.drained,
        error=runtime.error,
    )


async def healthz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    return _json({"status": runtime.mode}, 503 if runtime.mode == "failed" else 200)


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    return _json({"ready": runtime.ready, "mode": runtime.mode}, 200 if runtime.ready else 503)


async def status(request: web.Request) -> web.Response:
    return _json(status_of(request.app[RUNTIME]).model_dump(mode="json"))


async def promotion(request: web.Request) -> web.Response:
    """How this instance became owner, with a fingerprint of its state at ``fence_seq``
    (computed on first request, off the path of the cutover)."""
    promoted = request.app[RUNTIME].promotion
    if promoted is None:
        return _json(
            {"reason": "NotPromoted", "message": "this instance was not promoted from a shadow"},
            404,
        )
    digest = await asyncio.to_thread(promoted.state_digest)
    return _json(
        {
            "epoch": promoted.epoch,
            "fence_seq": promoted.fence_seq,
            "state_digest": digest,
            "at": promoted.at,
        }
    )


async def state(request: web.Request) -> web.Response:
    """The whole session state as this instance has folded it (for debugging)."""
    return _json(dump_state(request.app[RUNTIME].folder.peek()))


async def snapshot(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    if runtime.mode != "owner":
        return _json(
            {
                "reason": "NotOwner",
                "message": f"only the owner stores snapshots; this instance is {runtime.mode}",
            },
            409,
        )
    return _json({"watermark": await runtime.snapshot()}, 201)


async def checkpoint(request: web.Request) -> web.Response:
    """Fork a stopped copy of this owner for CRIU to dump (``shadowpod.agent.checkpoint``).

    A copy restored from it answers this same request too, in a connection that died
    with the dump: nobody reads that answer.
    """
    try:
        asked = CheckpointRequest.model_validate_json(await request.read() or b"{}")
    except ValidationError as exc:
        return _json({"reason": "BadRequest", "message": f"not a checkpoint request: {exc}"}, 400)
    runtime = request.app[RUNTIME]
    try:
        taken = await runtime.checkpoint(
            None if asked.output is None else Path(asked.output), asked.wait_s
        )
    except CheckpointRefused as exc:
        return _json({"reason": "CheckpointRefused", "message": str(exc)}, 409)
    except OSError as exc:
        return _json({"reason": "CheckpointFailed", "message": f"cannot fork: {exc}"}, 500)
    report = CheckpointReport(
        pid=taken.pid, watermark=taken.watermark, epoch=taken.epoch, instance=taken.instance
    )
    return _json(report.model_dump(mode="json"), 201)


def make_status_app(runtime: AgentRuntime) -> web.Application:
    app = web.Application()
    app[RUNTIME] = runtime
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/state", state)
    app.router.add_get("/v1/promotion", promotion)
    app.router.add_post("/v1/snapshot", snapshot)
    app.router.add_post("/v1/checkpoint", checkpoint)
    return app
