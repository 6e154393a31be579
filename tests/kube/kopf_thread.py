"""Kopf in a side thread: ``kopf.operator(...)`` on its own event loop, stopped by a
flag, against the emulator or a real cluster — the way an operator's tests run it.

Settings are the ones the operator itself uses (issue 12): standalone, finalizer and
annotations under ``shadowpod.dev/``, explicit watch timeouts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Collection
from typing import Any

import kopf

from tests.kube.connection import KubeConnection

PREFIX = "shadowpod.dev"
FINALIZER = f"{PREFIX}/finalizer"


def operator_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 70
    settings.watching.connect_timeout = 5
    settings.networking.request_timeout = 30
    settings.posting.level = logging.INFO
    return settings


class OperatorThread:
    """Runs ``registry``'s handlers until ``stop()``; a failure of Kopf is raised there."""

    def __init__(
        self,
        registry: kopf.OperatorRegistry,
        connection: KubeConnection,
        *,
        namespaces: Collection[str] = (),
        settings: Callable[[kopf.OperatorSettings], None] | None = None,
        memo: Any = None,
    ) -> None:
        self.registry = registry
        self.connection = connection
        self.namespaces = list(namespaces)
        self.settings = operator_settings()
        if settings is not None:
            settings(self.settings)
        self.memo = memo
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kopf-operator", daemon=True)
        self.error: BaseException | None = None

        @kopf.on.login(registry=registry)
        async def login(**_: Any) -> kopf.ConnectionInfo:
            return await connection.kopf_login()

    async def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        ready = await asyncio.to_thread(self._ready.wait, timeout)
        if self.error is not None:
            raise RuntimeError("the operator failed to start") from self.error
        if not ready:
            raise TimeoutError(f"the operator was not ready within {timeout} s")

    async def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the operator did not stop within {timeout} s")
        if self.error is not None:
            raise RuntimeError("the operator failed") from self.error

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(
                kopf.operator(
                    registry=self.registry,
                    settings=self.settings,
                    standalone=True,
                    clusterwide=not self.namespaces,
                    namespaces=self.namespaces,
                    stop_flag=self._stop,
                    ready_flag=self._ready,
                    memo=self.memo,
                )
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread by stop()
            self.error = exc
            self._ready.set()
        finally:
            # What Kopf left running (a handler it gave up waiting for) is cancelled and
            # awaited here, so that its connections close before the loop does.
            loop.run_until_complete(_cancel(asyncio.all_tasks(loop)))
            # Closed connections close their sockets on a later turn of the loop.
            loop.run_until_complete(asyncio.sleep(0.25))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


async def _cancel(tasks: set[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
