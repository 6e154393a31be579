"""The local runtime served to a migration engine in another process.

On a cluster the operator is one process and the pods live on; killing the operator
leaves them running. Locally, the instances are children of the process that runs
the ``LocalRuntime``, and they die with it (see ``shadowpod.eventloop``). To kill an
engine with ``kill -9`` and leave its instances alone — as the crash campaign does
(``shadowpod bench chaos``) — the runtime stays in the parent and the engine reaches it
over a Unix socket: ``RuntimeService`` serves the ``Runtime`` port's calls, and
``RemoteRuntime`` is the port for the engine, as the Kubernetes API would be.

A connection that fails is ``RuntimeUnavailable`` (the engine asks again); an error
the runtime raises on purpose comes back as the same error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web

from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.ports import (
    ImageInfo,
    ImageNotFound,
    InstanceSpec,
    InstanceStatus,
    RuntimeFailure,
    RuntimeUnavailable,
)
from shadowpod.local.runtime import LocalRuntime

CALL_TIMEOUT_S: Final = 60.0
_ERRORS: Final[dict[str, type[ShadowpodError]]] = {
    ImageNotFound.reason: ImageNotFound,
    RuntimeFailure.reason: RuntimeFailure,
}

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class RuntimeService:
    """``start()`` serves ``runtime`` on the Unix socket ``path``; ``close()`` stops."""

    def __init__(self, runtime: LocalRuntime, path: Path) -> None:
        self.runtime = runtime
        self.path = path
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        calls: dict[str, Handler] = {
            "describe": self._describe,
            "missing_credentials": self._missing_credentials,
            "start": self._start,
            "status": self._status,
            "stop": self._stop,
        }
        app = web.Application()
        for name, call in calls.items():
            app.router.add_post(f"/{name}", _handler(call))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.path.unlink(missing_ok=True)
        await web.UnixSite(self._runner, str(self.path)).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _describe(self, body: dict[str, Any]) -> Any:
        return (await self.runtime.describe(str(body["image"]))).model_dump(mode="json")

    async def _missing_credentials(self, body: dict[str, Any]) -> Any:
        return await self.runtime.missing_credentials(
            str(body["image"]), [str(n) for n in body["names"]]
        )

    async def _start(self, body: dict[str, Any]) -> Any:
        await self.runtime.start(InstanceSpec.model_validate(body["spec"]))
        return None

    async def _status(self, body: dict[str, Any]) -> Any:
        return (await self.runtime.status(str(body["name"]))).model_dump(mode="json")

    async def _stop(self, body: dict[str, Any]) -> Any:
        await self.runtime.stop(str(body["name"]), grace_s=float(body["grace_s"]))
        return None


def _handler(call: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        try:
            result = await call(await request.json())
        except ShadowpodError as exc:
            return web.json_response({"reason": exc.reason, "message": str(exc)}, status=409)
        return web.json_response({"result": result})

    return handle


class RemoteRuntime:
    """The engine's ``Runtime`` port, served by a ``RuntimeService`` at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def _call(self, call: str, **body: Any) -> Any:
        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(self.path)))
        try:
            async with self._http.post(
                f"http://runtime/{call}",
                json=body,
                timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S),
            ) as response:
                answer = await response.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RuntimeUnavailable(
                f"no answer from the runtime at {self.path}: {str(exc) or type(exc).__name__}"
            ) from exc
        if "reason" in answer:
            raise _ERRORS.get(answer["reason"], RuntimeFailure)(answer["message"])
        return answer["result"]

    async def describe(self, image: str) -> ImageInfo:
        return ImageInfo.model_validate(await self._call("describe", image=image))

    async def missing_credentials(self, image: str, names: list[str]) -> list[str]:
        return [str(n) for n in await self._call("missing_credentials", image=image, names=names)]

    async def start(self, spec: InstanceSpec) -> None:
        await self._call("start", spec=spec.model_dump(mode="json"))

    async def status(self, name: str) -> InstanceStatus:
        return InstanceStatus.model_validate(await self._call("status", name=name))

    async def stop(self, name: str, *, grace_s: float) -> None:
        await self._call("stop", name=name, grace_s=grace_s)
