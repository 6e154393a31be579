"""What ``shadowpod migrate`` and ``shadowpod status`` use to reach a running ``shadowpod up``.

A ``DeploymentUnreachable`` says, in one line, what to do: start one, or start it
again; a ``DeploymentRefused`` carries the deployment's reason and message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import aiohttp

from shadowpod.engine.record import MigrationRecord
from shadowpod.local.standing import deployment_file

CALL_TIMEOUT_S: Final = 30.0


class DeploymentUnreachable(Exception):
    pass


class DeploymentRefused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class StandingClient:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        path = deployment_file(workdir)
        try:
            self.facts: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DeploymentUnreachable(
                f"no deployment running in {workdir}: start one with "
                f"`shadowpod up --workdir {workdir}` (and leave it running)"
            ) from exc
        self.socket = str(self.facts["socket"])
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> StandingClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._http is not None:
            await self._http.close()

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.socket))
        try:
            async with self._http.request(
                method,
                f"http://deployment{path}",
                json=body,
                timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S),
            ) as response:
                answer = await response.json()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise DeploymentUnreachable(
                f"the deployment in {self.workdir} (pid {self.facts.get('pid')}) does not "
                f"answer ({str(exc) or type(exc).__name__}): is `shadowpod up` still running? "
                "if it was killed, start one with `shadowpod up --workdir DIR` in a new directory"
            ) from exc
        if status >= 400:
            raise DeploymentRefused(str(answer.get("reason")), str(answer.get("message")))
        return answer

    async def status(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("GET", "/status")
        return answer

    async def migrate(self, target: str, *, session: str | None = None) -> MigrationRecord:
        answer = await self._call("POST", "/migrations", {"to": target, "session": session})
        return MigrationRecord.model_validate(answer["record"])

    async def migration(self, migration_id: str) -> MigrationRecord:
        return MigrationRecord.model_validate(
            await self._call("GET", f"/migrations/{migration_id}")
        )

    async def suspend(self, *, session: str | None = None) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("POST", "/suspend", {"session": session})
        return answer

    async def fork(self, name: str, seq: int, *, session: str | None = None) -> dict[str, Any]:
        body = {"session": session, "name": name, "seq": seq}
        answer: dict[str, Any] = await self._call("POST", "/fork", body)
        return answer

    async def resume(self, *, session: str | None = None) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("POST", "/resume", {"session": session})
        return answer
