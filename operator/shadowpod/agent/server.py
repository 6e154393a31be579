"""The agent's own HTTP endpoints: health, readiness, status, state, snapshot and
checkpoint on request, and the sandbox upgrade gates ask this instance to answer in
(``POST /v1/sandbox/replay``, see docs/upgrade-gates.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from shadowpod.agent.compare import WindowLost, WindowNotReady
from shadowpod.agent.identity import SessionIdentity
from shadowpod.agent.persona import NoReanchorHook, probe, reanchor
from shadowpod.agent.runtime import AgentRuntime, CheckpointRefused
from shadowpod.agent.sandbox import MAX_GOLDEN_BYTES, replay_golden
from shadowpod.api.agent import (
    AgentStatus,
    CatchUpReport,
    CheckpointReport,
    CheckpointRequest,
    PromotionReport,
)
from shadowpod.domain.schema import dump_state
from shadowpod.gates.golden import GoldenFile, GoldenInvalid

RUNTIME = web.AppKey("runtime", AgentRuntime)
# One sandbox run at a time in this process: a gate's replay must not crowd the turns
# this instance serves, nor another replay.
SANDBOX_LOCK = web.AppKey("sandbox_lock", asyncio.Lock)


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


def _error(error: str, message: str, status: int) -> web.Response:
    return _json({"error": error, "reason": error, "message": message}, status)


async def sandbox_replay(request: web.Request) -> web.Response:
    """Answer a golden file (its JSON Lines as the body) in the sandbox, from the
    golden's own base state: this instance's state and journal are not touched."""
    if request.content_length is not None and request.content_length > MAX_GOLDEN_BYTES:
        return _too_large(request.content_length)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _too_large(None)
    try:
        golden = GoldenFile.loads(body.decode("utf-8", errors="replace"), name="the request body")
    except GoldenInvalid as exc:
        hint = "send a golden file as `shadowpod golden record` writes it"
        return _error("GoldenInvalid", f"{exc}; {hint}", 400)
    runtime = request.app[RUNTIME]
    async with request.app[SANDBOX_LOCK]:
        report = await replay_golden(runtime.agent, golden)
    return _json(report.model_dump(mode="json"))


def _too_large(size: int | None) -> web.Response:
    sent = f"{size} bytes" if size is not None else "more"
    return _error(
        "GoldenTooLarge",
        f"a golden file of at most {MAX_GOLDEN_BYTES} bytes is replayed here, not {sent}: "
        "record a shorter slice (--from/--to)",
        413,
    )


async def open_window(request: web.Request) -> web.Response:
    """``{"after": SEQ, "turns": N}``: from now on, answer the live turns after SEQ (the
    first N of them; every one without ``turns``) in the sandbox."""
    try:
        asked = orjson.loads(await request.read())
        after = asked["after"]
        turns = asked.get("turns")
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise ValueError("after must be a seq (an integer >= 0)")
        if turns is not None and (
            not isinstance(turns, int) or isinstance(turns, bool) or turns < 1
        ):
            raise ValueError("turns must be a count (an integer >= 1), or absent")
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return _error("BadRequest", f'expected {{"after": SEQ}}: {exc}', 400)
    runtime = request.app[RUNTIME]
    try:
        window = runtime.open_window(after, turns)
    except WindowLost as exc:
        return _error("NotShadow", str(exc), 409)
    return _json(
        {
            "after": window.after,
            "watermark": runtime.folder.watermark,
            "opened_at": window.opened_at,
        }
    )


async def compare_report(request: web.Request) -> web.Response:
    """``?after=A&to=B``: the window's answers to the turns after A acked by B."""
    try:
        after, to = int(request.query["after"]), int(request.query["to"])
    except (KeyError, ValueError):
        return _error("BadRequest", "expected ?after=SEQ&to=SEQ (integers)", 400)
    runtime = request.app[RUNTIME]
    window = runtime.window
    if window is None:
        return _error(
            "WindowLost",
            f"this instance ({runtime.mode}) has no compare window open: it was restarted "
            "or promoted since; open another one",
            409,
        )
    try:
        report = window.report(after=after, to=to, watermark=runtime.folder.watermark)
    except WindowLost as exc:
        return _error("WindowLost", f"{exc}: open another one", 409)
    except WindowNotReady as exc:
        return _error("Pending", f"{exc}; ask again", 409)
    return _json(report.model_dump(mode="json"))


async def persona_probe(request: web.Request) -> web.Response:
    """``{"message": TEXT}``: this instance's answer, in the sandbox, from its state."""
    try:
        asked = orjson.loads(await request.read())
        message = asked["message"]
        if not isinstance(message, str) or not message.strip():
            raise ValueError("message must be a non-empty string")
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return _error("BadRequest", f'expected {{"message": TEXT}}: {exc}', 400)
    runtime = request.app[RUNTIME]
    async with request.app[SANDBOX_LOCK]:
        reply, meta = await probe(runtime.agent, runtime.folder.view(), message)
    return _json(
        {
            "reply": reply,
            "meta": meta,
            "agent": runtime.agent.name,
            "version": runtime.agent.version,
            "instance": runtime.identity.instance,
        }
    )


async def persona_reanchor(request: web.Request) -> web.Response:
    """Call the agent's re-anchor hook with the session's identity (its files)."""
    runtime = request.app[RUNTIME]
    try:
        identity = SessionIdentity.load(runtime.settings.identity_dir, runtime.session)
    except ValueError as exc:
        return _error("IdentityInvalid", str(exc), 409)
    try:
        await reanchor(runtime.agent, identity)
    except NoReanchorHook as exc:
        return _error("NoReanchorHook", str(exc), 409)
    return _json({"reanchored": True, "name": identity.name, "principles": identity.principles})


def make_status_app(runtime: AgentRuntime) -> web.Application:
    # The body limit is the sandbox's: every other request is small.
    app = web.Application(client_max_size=MAX_GOLDEN_BYTES)
    app[RUNTIME] = runtime
    app[SANDBOX_LOCK] = asyncio.Lock()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/state", state)
    app.router.add_get("/v1/promotion", promotion)
    app.router.add_post("/v1/snapshot", snapshot)
    app.router.add_post("/v1/checkpoint", checkpoint)
    app.router.add_post("/v1/sandbox/replay", sandbox_replay)
    app.router.add_post("/v1/compare/window", open_window)
    app.router.add_get("/v1/compare", compare_report)
    app.router.add_post("/v1/sandbox/probe", persona_probe)
    app.router.add_post("/v1/persona/reanchor", persona_reanchor)
    return app
