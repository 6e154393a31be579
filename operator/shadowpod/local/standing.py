"""A local deployment that keeps running: ``shadowpod up``, moved by ``shadowpod migrate``.

``shadowpod demo`` starts a gateway and an agent, migrates, and stops everything. A
``StandingDeployment`` instead starts a gateway and one session's owner in a work
directory and keeps them serving; it is to a local deployment what the operator is to
a cluster: it holds the runtime (the agents are its children) and runs each migration
through the engine. Other commands reach it over a Unix socket in the work directory
(``DeploymentService``, ``shadowpod.local.standing_client``):

- ``GET /status`` — the gateway, the sessions with their owner (instance and image),
  the migrations run;
- ``POST /migrations`` ``{"session", "to"}`` — starts a migration, answers at once
  with its id (202); an unknown session or image, or a migration already running for
  the session, is a 4xx ``{"reason", "message"}``;
- ``GET /migrations/{id}`` — its record as the engine saved it last;
- ``POST /suspend``, ``POST /resume`` ``{"session"}``; ``POST /fork`` ``{"session",
  "name", "seq"}`` — a new session from the session's state at ``seq``, served here.

The migration runs here, not in the command that asked for it: a ``migrate`` that is
interrupted stops watching, and the session keeps its owner whatever happens.
``up.json`` in the work directory says where everything is (``deployment_file``)
while it runs; ``deployment.json`` (``saved_file``) what it serves — each session's
image, the image map — and stays when it stops: ``resume()`` starts the gateway on
the same journal and each session's owner again, at the next epoch, from its latest
snapshot and the journal (the recovery path a lost pod takes on Kubernetes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from shadowpod.api.models import ForkFrom
from shadowpod.client.gateway import GatewayError
from shadowpod.engine.ports import ImageNotFound, InstanceSpec
from shadowpod.engine.record import InstanceRef, MigrationRecord, Phase
from shadowpod.local import suspension
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import ImageMap
from shadowpod.sessions.tokens import new_owner_key

DEPLOYMENT_FILE: Final = "up.json"
SAVED_FILE: Final = "deployment.json"
SOCKET_FILE: Final = "up.sock"


def deployment_file(workdir: Path) -> Path:
    return workdir / DEPLOYMENT_FILE


def saved_file(workdir: Path) -> Path:
    return workdir / SAVED_FILE


@dataclass(frozen=True)
class SavedDeployment:
    """What a stopped (or killed) ``shadowpod up`` served: enough to resume it."""

    images: Path | None  # the image map it was given; None: the reference agent's
    port: int
    sessions: dict[str, str]  # session: the image its owner runs

    @classmethod
    def load(cls, workdir: Path) -> SavedDeployment | None:
        """None when the directory holds no deployment; ValueError when the file is
        not one ``shadowpod up`` wrote."""
        path = saved_file(workdir)
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text())
            return cls(
                images=Path(raw["images"]) if raw["images"] else None,
                port=int(raw["port"]),
                sessions={str(k): str(v) for k, v in raw["sessions"].items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path} is not a deployment shadowpod up wrote ({exc})") from None


@dataclass
class StandingSession:
    name: str
    owner: InstanceRef
    agent_token: str
    running: asyncio.Task[MigrationRecord] | None = None
    suspended: bool = False


class MigrationRefused(Exception):
    """A migration that cannot start; ``reason`` one word, the message what to do."""

    def __init__(self, reason: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


class StandingDeployment:
    """``start()`` brings up a gateway and ``session`` on ``image``; ``close()`` stops all."""

    def __init__(
        self,
        workdir: Path,
        images: ImageMap,
        *,
        port: int | None = None,
        images_path: Path | None = None,
    ) -> None:
        self.workdir = workdir.absolute()
        self.images = images
        self.images_path = images_path.absolute() if images_path else None
        # The port goes in first: the runtime and the engine's client take the URL.
        self.deployment = LocalDeployment(self.workdir, images, gateway_port=port)
        self.sessions: dict[str, StandingSession] = {}
        self.migrations: dict[str, MigrationRecord] = {}
        self._runner: web.AppRunner | None = None
        # One suspend or resume at a time (a wake and `shadowpod resume` may race).
        self._lifecycle = asyncio.Lock()
        self._wakes = suspension.WakeListener(self.deployment, self._woken)

    @property
    def socket(self) -> Path:
        return self.workdir / SOCKET_FILE

    async def start(self, session: str, image: str) -> StandingSession:
        self.images.resolve(image)  # an unknown image is refused before anything starts
        await self.deployment.__aenter__()
        owner = InstanceRef(name=self.deployment.next_name(session), image=image)
        # Kept beside the agent token: a resumed deployment's new owners need
        # credentials derived from the key the session was created with.
        owner_key = new_owner_key()
        _write_secret(self._owner_key_file(session), owner_key)
        token = await self.deployment.create_session(
            session, image=owner.image, instance=owner.name, owner_key=owner_key
        )
        standing = StandingSession(session, owner, token)
        self.sessions[session] = standing
        _write_secret(self._token_file(session), token)
        await self._serve()
        self._write_deployment_file()
        return standing

    async def resume(self, saved: SavedDeployment) -> list[tuple[StandingSession, int]]:
        """Serve ``saved``'s sessions again: the gateway on the same journal, and each
        session's owner started anew at the next epoch (from its latest snapshot and
        the journal). Returns each session with the epoch it was at."""
        for image in saved.sessions.values():
            self.images.resolve(image)  # an image no longer in the map: refused first
        self.deployment.names_used()
        await self.deployment.__aenter__()
        resumed = []
        for name, image in saved.sessions.items():
            token = self._token_file(name).read_text().strip()
            ownership = await self.deployment.control.ownership(name)
            owner = InstanceRef(name=self.deployment.next_name(name), image=image)
            # The epoch first: whatever the last owner was doing, it may write no more.
            await self.deployment.control.set_owner(
                name, expect_epoch=ownership.epoch, epoch=ownership.epoch + 1, owner=owner.name
            )
            key_file = self._owner_key_file(name)
            owner_key = key_file.read_text().strip() if key_file.is_file() else None
            self.deployment.runtime.register_session(name, token, owner_key=owner_key)
            await self.deployment.runtime.start(
                InstanceSpec(
                    name=owner.name,
                    image=image,
                    session=name,
                    mode="owner",
                    epoch=ownership.epoch + 1,
                )
            )
            await self.deployment.wait_serving(owner.name)
            standing = StandingSession(name, owner, token)
            self.sessions[name] = standing
            resumed.append((standing, ownership.epoch))
        await self._serve()
        self._write_deployment_file()
        return resumed

    def _token_file(self, session: str) -> Path:
        return self.workdir / "sessions" / session / "agent-token"

    def _owner_key_file(self, session: str) -> Path:
        return self.workdir / "sessions" / session / "owner-key"

    async def close(self) -> None:
        deployment_file(self.workdir).unlink(missing_ok=True)
        await self._wakes.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.socket.unlink(missing_ok=True)
        for standing in self.sessions.values():
            if standing.running is not None and not standing.running.done():
                standing.running.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await standing.running
        await self.deployment.__aexit__(None, None, None)

    # --- what the socket serves ---------------------------------------------------------

    def status(self) -> dict[str, Any]:
        gateway = self.deployment.gateway
        return {
            "pid": os.getpid(),
            "workdir": str(self.workdir),
            "gateway": gateway.url,
            "control_token_file": str(gateway.workdir / "control-token"),
            "journal": gateway.journal_url,
            "images": sorted(self.images.images),
            "sessions": [
                {
                    "session": s.name,
                    "url": f"{gateway.url}/v1/sessions/{s.name}",
                    "owner": s.owner.name,
                    "image": s.owner.image,
                    "migrating": s.running is not None and not s.running.done(),
                    "suspended": s.suspended,
                    "log": str(self.workdir / "instances" / s.owner.name / "agent.log"),
                }
                for s in self.sessions.values()
            ],
            "migrations": [
                {
                    "id": r.spec.id,
                    "session": r.spec.session,
                    "from": r.spec.source.image,
                    "to": r.spec.target.image,
                    "phase": r.phase.value,
                    "reason": r.reason,
                }
                for r in self.migrations.values()
            ],
        }

    async def fork(self, parent: str | None, name: str, seq: int) -> dict[str, Any]:
        """A new session ``name`` from ``parent``'s state at ``seq`` (its journal
        shared up to there), its own owner on the parent's image; the parent serves on."""
        async with self._lifecycle:
            standing = self._session(parent)
            if name in self.sessions:
                raise MigrationRefused("SessionExists", f"session {name!r} exists", status=409)
            owner = InstanceRef(name=self.deployment.next_name(name), image=standing.owner.image)
            owner_key = new_owner_key()
            _write_secret(self._owner_key_file(name), owner_key)
            try:
                token = await self.deployment.create_session(
                    name,
                    image=owner.image,
                    instance=owner.name,
                    owner_key=owner_key,
                    fork_from=ForkFrom(session=standing.name, seq=seq),
                )
            except GatewayError as exc:
                raise MigrationRefused(exc.reason, exc.message, status=exc.status) from exc
            self.sessions[name] = StandingSession(name, owner, token)
            _write_secret(self._token_file(name), token)
            self._write_deployment_file()
            return {"session": name, "fork_of": standing.name, "seq": seq, "owner": owner.name}

    async def suspend(self, session: str | None) -> dict[str, Any]:
        """Suspend ``session``: its owner fenced out and stopped, messages kept."""
        async with self._lifecycle:
            standing = self._session(session)
            if standing.running is not None and not standing.running.done():
                raise MigrationRefused(
                    "MigrationRunning",
                    f"session {standing.name!r} is being migrated: suspend it once that ends",
                    status=409,
                )
            if standing.suspended:
                raise MigrationRefused(
                    "AlreadySuspended", f"session {standing.name!r} is suspended", status=409
                )
            try:
                snapshot = await suspension.suspend(self.deployment, standing.name, standing.owner)
            except GatewayError as exc:
                if exc.reason != "FenceTimeout":
                    raise
                raise MigrationRefused("OwnerBusy", f"{exc}", status=409) from exc
            standing.suspended = True
            self._write_deployment_file()
            return {"session": standing.name, "suspended": True, "snapshot": snapshot}

    async def resume_session(self, session: str | None) -> dict[str, Any]:
        """A new owner for a suspended ``session``, answering what waited."""
        async with self._lifecycle:
            standing = self._session(session)
            if not standing.suspended:
                raise MigrationRefused(
                    "NotSuspended", f"session {standing.name!r} is not suspended", status=409
                )
            return await self._resume(standing)

    async def _resume(self, standing: StandingSession) -> dict[str, Any]:
        standing.owner = await suspension.resume(
            self.deployment, standing.name, standing.owner.image
        )
        standing.suspended = False
        self._write_deployment_file()
        return {"session": standing.name, "suspended": False, "owner": standing.owner.name}

    async def _woken(self, session: str) -> None:
        # Under the lock: a wake can come while the suspend that it follows still runs.
        async with self._lifecycle:
            standing = self.sessions.get(session)
            if standing is not None and standing.suspended:
                await self._resume(standing)

    def migrate(self, session: str | None, target: str) -> MigrationRecord:
        """Start a migration of ``session`` (the only one when ``None``) to ``target``."""
        standing = self._session(session)
        if standing.suspended:
            raise MigrationRefused(
                "Suspended",
                f"session {standing.name!r} is suspended: resume it first (shadowpod resume)",
                status=409,
            )
        if standing.running is not None and not standing.running.done():
            raise MigrationRefused(
                "MigrationRunning",
                f"session {standing.name!r} is being migrated already: wait for it to end "
                "(shadowpod status)",
                status=409,
            )
        try:
            self.images.resolve(target)
        except ImageNotFound as exc:
            raise MigrationRefused(
                "ImageNotFound", f"{exc}: add it to the image map given to shadowpod up"
            ) from exc
        record = self.deployment.plan(standing.name, source=standing.owner, target_image=target)
        self.migrations[record.spec.id] = record
        standing.running = asyncio.create_task(
            self._run(standing, record), name=f"migrate-{record.spec.id}"
        )
        return record

    async def record(self, migration_id: str) -> MigrationRecord | None:
        saved = await self.deployment.records.load(migration_id)
        if saved is not None and migration_id in self.migrations:
            # The engine saves before each phase acts; the end is kept here too.
            known = self.migrations[migration_id]
            return known if known.done and not saved.done else saved
        return saved or self.migrations.get(migration_id)

    def _session(self, session: str | None) -> StandingSession:
        if session is None:
            if len(self.sessions) != 1:
                raise MigrationRefused("SessionRequired", "name the session to migrate")
            return next(iter(self.sessions.values()))
        found = self.sessions.get(session)
        if found is None:
            known = ", ".join(sorted(self.sessions)) or "none"
            raise MigrationRefused(
                "SessionNotFound",
                f"no session {session!r} in this deployment (sessions: {known})",
                status=404,
            )
        return found

    async def _run(self, standing: StandingSession, record: MigrationRecord) -> MigrationRecord:
        try:
            record = await self.deployment.migrate(record)
        except Exception as exc:  # noqa: BLE001 — said in the record, the deployment lives on
            record = record.model_copy(
                update={"phase": Phase.FAILED, "error": f"{type(exc).__name__}: {exc}"}
            )
        self.migrations[record.spec.id] = record
        if record.phase is Phase.SUCCEEDED:
            standing.owner = record.spec.target
        elif record.phase is Phase.FAILED:
            # Failed after the epoch bump, the target may own the session: follow the truth.
            with contextlib.suppress(Exception):
                ownership = await self.deployment.control.ownership(standing.name)
                if ownership.owner == record.spec.target.name:
                    standing.owner = record.spec.target
        self._write_deployment_file()
        return record

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/status", _json(self._get_status))
        app.router.add_post("/migrations", _json(self._post_migration))
        app.router.add_get("/migrations/{id}", _json(self._get_migration))
        app.router.add_post("/suspend", _json(self._post_suspend))
        app.router.add_post("/resume", _json(self._post_resume))
        app.router.add_post("/fork", _json(self._post_fork))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.socket.unlink(missing_ok=True)
        await web.UnixSite(self._runner, str(self.socket)).start()
        self._wakes.start()

    async def _post_suspend(self, request: web.Request) -> tuple[int, Any]:
        return await self._lifecycle_call(request, self.suspend)

    async def _post_fork(self, request: web.Request) -> tuple[int, Any]:
        try:
            body = await request.json()
            parent, name, seq = body.get("session"), str(body["name"]), int(body["seq"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return 400, {"reason": "BadRequest", "message": 'send {"name": N, "seq": S}'}
        try:
            return 201, await self.fork(None if parent is None else str(parent), name, seq)
        except MigrationRefused as exc:
            return exc.status, {"reason": exc.reason, "message": str(exc)}

    async def _post_resume(self, request: web.Request) -> tuple[int, Any]:
        return await self._lifecycle_call(request, self.resume_session)

    async def _lifecycle_call(
        self, request: web.Request, call: Callable[[str | None], Awaitable[dict[str, Any]]]
    ) -> tuple[int, Any]:
        try:
            body = await request.json() if request.can_read_body else {}
            session = body.get("session")
        except (ValueError, AttributeError):
            return 400, {"reason": "BadRequest", "message": 'send {"session": S} or nothing'}
        try:
            return 200, await call(None if session is None else str(session))
        except MigrationRefused as exc:
            return exc.status, {"reason": exc.reason, "message": str(exc)}

    async def _get_status(self, request: web.Request) -> tuple[int, Any]:
        return 200, self.status()

    async def _post_migration(self, request: web.Request) -> tuple[int, Any]:
        try:
            body = await request.json()
            session, target = body.get("session"), body["to"]
        except (ValueError, KeyError, AttributeError):
            return 400, {"reason": "BadRequest", "message": 'send {"to": IMAGE, "session": S}'}
        try:
            record = self.migrate(session, str(target))
        except MigrationRefused as exc:
            return exc.status, {"reason": exc.reason, "message": str(exc)}
        return 202, {"id": record.spec.id, "record": record.model_dump(mode="json")}

    async def _get_migration(self, request: web.Request) -> tuple[int, Any]:
        record = await self.record(request.match_info["id"])
        if record is None:
            return 404, {"reason": "MigrationNotFound", "message": "no such migration"}
        return 200, record.model_dump(mode="json")

    def _write_deployment_file(self) -> None:
        _write(deployment_file(self.workdir), {**self.status(), "socket": str(self.socket)})
        _write(
            saved_file(self.workdir),
            {
                "images": str(self.images_path) if self.images_path else None,
                "port": self.deployment.gateway.port,
                "sessions": {s.name: s.owner.image for s in self.sessions.values()},
            },
        )


def _write_secret(path: Path, value: str) -> None:
    """``value`` in a file only its user reads (made so before anything is written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")


def _write(path: Path, content: Any) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(content, indent=2))
    temporary.replace(path)


def _json(
    call: Callable[[web.Request], Awaitable[tuple[int, Any]]],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        status, body = await call(request)
        return web.json_response(body, status=status)

    return handle
