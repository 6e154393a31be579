"""``LocalDeployment``: a gateway, agent instances and the engine, all on this machine."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from shadowpod.agent.identity import SessionIdentity
from shadowpod.api.models import CreateSession, CredentialSpec, ForkFrom, ScheduleSpec
from shadowpod.client.control import GatewayControl
from shadowpod.client.gateway import GatewayClient
from shadowpod.client.sessions import start_session
from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.ports import InstanceSpec, InstanceStatus
from shadowpod.engine.record import (
    InstanceRef,
    MigrationPolicy,
    MigrationRecord,
    MigrationSpec,
    Strategy,
)
from shadowpod.local.criu import CriuRuntime
from shadowpod.local.gateway_process import GatewayProcess
from shadowpod.local.images import DescribedImages, ImageMap
from shadowpod.local.records import FileRecordStore
from shadowpod.local.runtime import LocalRuntime
from shadowpod.local.validation import local_validator
from shadowpod.sessions.tokens import new_owner_key


class LocalDeployment:
    def __init__(
        self,
        workdir: Path,
        images: ImageMap,
        *,
        journal_url: str | None = None,
        warm_spares: bool = False,
        checkpoints: bool = False,
        gateway_port: int | None = None,
        described: DescribedImages | None = None,
    ) -> None:
        """``checkpoints``: agents that CRIU can checkpoint (``shadowpod.local.criu``),
        and migrations with the ``criu`` strategy; no warm spares then.
        ``gateway_port``: the gateway's (default: a free one). ``described``: where
        what images' code said of their schemas is kept (default: the user's cache)."""
        # Absolute: instances and the gateway are told paths that must not depend on
        # the directory they run in.
        workdir = workdir.absolute()
        self.workdir = workdir
        self.gateway = GatewayProcess(
            workdir / "gateway", journal_url=journal_url, port=gateway_port
        )
        self.checkpointer: CriuRuntime | None = None
        if checkpoints:
            self.runtime: LocalRuntime = CriuRuntime(
                images, gateway_url=self.gateway.url, workdir=workdir
            )
            self.checkpointer = self.runtime
        else:
            self.runtime = LocalRuntime(
                images,
                gateway_url=self.gateway.url,
                workdir=workdir,
                warm_spares=warm_spares,
                described=described,
            )
        self.records = FileRecordStore(workdir / "migrations")
        self.admin = GatewayClient(self.gateway.url, self.gateway.control_token)
        self.control = GatewayControl(self.admin)
        self.validator = local_validator(self.admin, self.runtime)
        self.engine = MigrationEngine(
            self.runtime,
            self.control,
            self.records,
            checkpointer=self.checkpointer,
            validator=self.validator,
        )
        self._names = itertools.count(1)

    async def __aenter__(self) -> LocalDeployment:
        await self.gateway.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.runtime.close()
        await self.validator.close()
        await self.admin.close()
        await self.gateway.stop()

    def client(self) -> GatewayClient:
        """A client as end users have one (no token: client routes are open here)."""
        return GatewayClient(self.gateway.url)

    def add_credential(self, name: str, value: str) -> None:
        """A credential the runtime can mount (a file, as a Secret volume would be)."""
        path = self.runtime.credentials_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value)
        path.chmod(0o600)

    async def create_session(
        self,
        session: str,
        *,
        image: str,
        instance: str,
        credentials: Sequence[str] = (),
        schedules: Sequence[ScheduleSpec] = (),
        identity: SessionIdentity | None = None,
        owner_key: str | None = None,
        fork_from: ForkFrom | None = None,
    ) -> str:
        """Create ``session`` and start its first owner (epoch 1). Returns the agent
        token. ``identity``: who the agent is (its name and principles), as files.
        Owners write with credentials derived from ``owner_key`` (made here if not
        given; a caller that restarts the session later keeps it), kept by the runtime.
        ``fork_from``: the session is a fork, its first owner at the epoch after its
        parent's, restoring the parent's state at the fork point."""
        owner_key = owner_key or new_owner_key()
        created, ownership = await start_session(
            self.admin,
            CreateSession(
                session=session,
                credentials=[
                    CredentialSpec(name=name, secret_ref=f"{session}-credentials/{name}")
                    for name in credentials
                ],
                schedules=list(schedules),
                owner_key=owner_key,
                fork_from=fork_from,
            ),
            owner=instance,
        )
        if created.agent_token is None:  # only a caller that sent a token hash gets none
            raise RuntimeError("the gateway returned no agent token for a session it made")
        self.runtime.register_session(session, created.agent_token, identity, owner_key)
        await self.runtime.start(
            InstanceSpec(
                name=instance, image=image, session=session, mode="owner", epoch=ownership.epoch
            )
        )
        await self.wait_serving(instance)
        return created.agent_token

    async def wait_serving(self, instance: str, *, timeout_s: float = 30.0) -> InstanceStatus:
        import asyncio

        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            status = await self.runtime.status(instance)
            if status.serving and status.mode == "owner":
                return status
            if status.mode == "failed" or (
                not status.alive
                and status.error is not None
                and "never started" not in status.error
            ):
                raise RuntimeError(f"instance {instance!r} {status.error}")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"instance {instance!r} did not start serving")
            await asyncio.sleep(0.02)

    def next_name(self, session: str) -> str:
        return f"{session}-{next(self._names)}"

    def names_used(self) -> None:
        """Continue instance names after those an earlier run left in the work
        directory (a resumed deployment's instances get directories of their own)."""
        used = [
            int(suffix)
            for home in (self.workdir / "instances").glob("*-*")
            if (suffix := home.name.rsplit("-", 1)[1]).isdigit()
        ]
        self._names = itertools.count(max(used, default=0) + 1)

    def plan(
        self,
        session: str,
        *,
        source: InstanceRef,
        target_image: str,
        strategy: Strategy = "shadow",
        credentials: Sequence[str] = (),
        policy: MigrationPolicy | None = None,
    ) -> MigrationRecord:
        spec = MigrationSpec(
            id=f"{session}-{uuid.uuid4().hex[:8]}",
            session=session,
            source=source,
            target=InstanceRef(name=self.next_name(session), image=target_image),
            strategy=strategy,
            credentials=list(credentials),
            policy=policy or MigrationPolicy(),
        )
        return MigrationRecord(spec=spec)

    async def migrate(self, record: MigrationRecord) -> MigrationRecord:
        return await self.engine.run(record)
