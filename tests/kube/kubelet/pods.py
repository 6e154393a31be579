"""``PodWorker``: one pod on an emulated node, from start to deletion.

Each container runs as a local process, or — in the kubelet's container mode — as a
Docker container (``docker.py``) whose ``docker start --attach`` process stands for it
here: the container's output is that process's, its exit code the container's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from shadowpod.eventloop import EXIT_WITH_PARENT_ENV
from shadowpod.local.orphans import descendants
from tests.image.docker import DockerError
from tests.kube.emulator.store import now
from tests.kube.kubelet import api as raw
from tests.kube.kubelet import containers as build
from tests.kube.kubelet.containers import NotReadyToStart
from tests.kube.kubelet.podcheckpoints import restored_environment

if TYPE_CHECKING:
    from tests.kube.kubelet.kubelet import Kubelet

TICK = 0.1
MESSAGE_LIMIT = 4096


@dataclass
class ContainerRun:
    spec: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    log: Path
    termination_log: Path
    process: asyncio.subprocess.Process | None = None
    family: set[int] = field(default_factory=set)  # the processes it started, seen so far
    started_at: str | None = None
    restarts: int = 0
    ready: bool = False
    passes: int = 0
    failures: int = 0
    next_probe: float = 0.0
    last_state: dict[str, Any] | None = None
    terminated: dict[str, Any] | None = None  # its final state, when it will not restart
    restart_at: float | None = None
    waiting: tuple[str, str] | None = None
    # Container mode: ``docker create`` options and image (a new container per start),
    # and the container of the current start.
    docker_args: list[str] | None = None
    docker_name: str | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


async def stop(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it is done. Asked until it is: on Python 3.11 a
    cancel that lands as a ``wait_for`` inside it completes can be lost, and a loop
    around that ``wait_for`` would go on for ever."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    with contextlib.suppress(asyncio.CancelledError):
        await task


class PodWorker:
    def __init__(self, kubelet: Kubelet, pod: dict[str, Any], node: str) -> None:
        self.kubelet = kubelet
        self.pod = pod
        self.node = node
        self.ip = kubelet.next_address()
        meta = pod["metadata"]
        self.root = (
            kubelet.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        )
        self.containers: dict[str, ContainerRun] = {}
        self.started_at = now()
        self.deadline: float | None = None  # when SIGKILL comes, once deletion started
        self._reported: dict[str, Any] | None = None
        self.restore_refused: tuple[str, str] | None = None  # a KEP-5823 restore's refusal
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # --- what the kubelet calls -----------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            loop = asyncio.get_running_loop()
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            deadline = loop.time() + grace
            if self.deadline is None or deadline < self.deadline:
                self.deadline = deadline
            self._wake.set()

    async def kill(self) -> None:
        """Everything of this pod dies now (node loss, teardown); nothing is reported."""
        if self._task is not None:
            await stop(self._task)
        for run in self.containers.values():
            await self._kill_tree(run)

    def crash(self, container: str) -> None:
        """``kill -9`` of the container's processes (an OOM kill, a segfault): it ends
        with exit code 137, reported as a container does, and its restartPolicy says
        what follows."""
        run = self.containers[container]
        assert run.process is not None and run.process.returncode is None, "not running"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.process.pid, signal.SIGKILL)

    def freeze(self, container: str) -> None:
        """``SIGSTOP`` the container's processes: alive, answering nothing (a process
        stuck in a turn) until killed."""
        run = self.containers[container]
        assert run.process is not None and run.process.returncode is None, "not running"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.process.pid, signal.SIGSTOP)

    def logs(self, container: str) -> str:
        run = self.containers.get(container)
        return run.log.read_text(errors="replace") if run and run.log.exists() else ""

    # --- the pod's life -------------------------------------------------------------------

    async def _run(self) -> None:
        if not self.kubelet.run_processes:
            while self.deadline is None:
                await self._report()  # until it lands: a busy API server may time it out
                await self._wait(None if self._reported else 1.0)
            await self._finish()
            return
        while not await self._prepared():
            await self._report()
            await self._wait(0.5)
            if self.deadline is not None:
                await self._finish()
                return
        for run in self.containers.values():
            await self._launch(run)
        async with aiohttp.ClientSession() as http:
            while self.deadline is None:
                await self._supervise(http)
                await self._report()
                await self._wait(TICK)
        await self._terminate()
        await self._report()
        await self._finish()

    async def _wait(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    async def _prepared(self) -> bool:
        """Volumes written and every container's command and environment known."""
        namespace = self.pod["metadata"]["namespace"]
        fetched: dict[tuple[str, str], Any] = {}
        for plural, name in _references(self.pod):
            fetched[plural, name] = await self.kubelet.lookup(namespace, plural, name)

        def lookup(plural: str, name: str) -> Any:
            return fetched.get((plural, name))

        docker = self.kubelet.docker
        try:
            labels = self.pod["metadata"].get("labels") or {}
            if any(labels.get(key) == value for key, value in self.kubelet.held.items()):
                raise NotReadyToStart("ContainerCreating", "held by the test")
            volumes = build.write_volumes(self.pod, self.root, lookup)
            if docker is not None:
                docker.share(list(volumes.values()))
            for container in self.pod["spec"]["containers"]:
                if docker is not None:
                    await docker.check_image(container["image"])
                    directory = self.root / "containers" / container["name"]
                    directory.mkdir(parents=True, exist_ok=True)
                    termination_log = directory / "termination-log"
                    env = build.environment(self.pod, container, None, lookup)
                    options = docker.volume_options(self.pod, container, volumes, termination_log)
                    self.containers[container["name"]] = ContainerRun(
                        container,
                        [],
                        env,
                        directory / "log",
                        termination_log,
                        docker_args=docker.create_args(self.pod, container, env, options),
                    )
                    continue
                refusal = self.kubelet.restore_refusals.get(self.pod["spec"].get("nodeName", ""))
                if refusal is not None and "/checkpoint:" in container["image"]:
                    raise NotReadyToStart("CreateContainerError", refusal)
                restoring = bool(self.pod["spec"].get("restoreFrom"))
                self.restore_refused = self.kubelet.pod_restore_refusals.get(self.node)
                if restoring and self.restore_refused is not None:
                    raise NotReadyToStart("ContainerCreating", self.restore_refused[1])
                image = build.resolve_image(self.kubelet.images, container["image"])
                env = build.environment(self.pod, container, image, lookup)
                if restoring:
                    env = restored_environment(env)
                directory = self.root / "containers" / container["name"]
                directory.mkdir(parents=True, exist_ok=True)
                termination_log = directory / "termination-log"
                table = build.mounts(container, volumes, termination_log)
                env = {key: build.rewrite(value, table) for key, value in env.items()}
                argv = [build.rewrite(part, table) for part in build.command(container, image, env)]
                self.containers[container["name"]] = ContainerRun(
                    container, argv, env, directory / "log", termination_log
                )
        except NotReadyToStart as problem:
            waiting = (problem.reason, problem.message)
            pulled_before = any(
                run.waiting is not None and run.waiting[0] in ("ErrImagePull", "ImagePullBackOff")
                for run in self.containers.values()
            )
            if problem.reason == "ErrImagePull" and pulled_before:
                # As a kubelet does: a pull failed once, the next tries are backed off.
                images = ", ".join(c["image"] for c in self.pod["spec"]["containers"])
                waiting = ("ImagePullBackOff", f'Back-off pulling image "{images}"')
            self.containers = {
                c["name"]: ContainerRun(c, [], {}, Path(), Path(), waiting=waiting)
                for c in self.pod["spec"]["containers"]
            }
            return False
        return True

    async def _launch(self, run: ContainerRun) -> None:
        run.termination_log.write_bytes(b"")
        run.waiting = None
        argv, env = run.argv, {**run.env, EXIT_WITH_PARENT_ENV: str(os.getpid())}
        if run.docker_args is not None:
            docker = self.kubelet.docker
            assert docker is not None
            docker.share([run.termination_log])
            run.docker_name = docker.name(self.pod, run.name, run.restarts)
            try:
                await docker.create(run.docker_name, run.docker_args)
            except DockerError as exc:
                run.waiting = ("CreateContainerError", str(exc))
                loop = asyncio.get_running_loop()
                run.restart_at = loop.time() + min(0.5 * 2**run.restarts, 5.0)
                return
            argv, env = [*docker.start_attached(), run.docker_name], dict(os.environ)
        with run.log.open("ab") as sink:
            run.process = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                cwd=str(self.root),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        run.started_at = now()
        run.family = set()
        probe = run.spec.get("readinessProbe")
        run.ready = probe is None
        run.passes = run.failures = 0
        delay = float((probe or {}).get("initialDelaySeconds", 0))
        run.next_probe = asyncio.get_running_loop().time() + delay

    async def _supervise(self, http: aiohttp.ClientSession) -> None:
        loop = asyncio.get_running_loop()
        policy = self.pod["spec"].get("restartPolicy", "Always")
        for run in self.containers.values():
            if run.running:
                assert run.process is not None
                run.family.update(descendants(run.process.pid, self.kubelet.process_children()))
                probe = run.spec.get("readinessProbe")
                if probe is not None and loop.time() >= run.next_probe:
                    run.next_probe = loop.time() + float(probe.get("periodSeconds", 10))
                    await self._probe(http, run, probe)
                continue
            if (
                run.process is not None
                and run.process.returncode is not None
                and run.restart_at is None
                and run.terminated is None
            ):
                await self._kill_tree(run)  # the container's process tree dies with it
                state = self._terminated_state(run)
                code = run.process.returncode
                if policy == "Always" or (policy == "OnFailure" and code != 0):
                    run.last_state = {"terminated": state}
                    run.restart_at = loop.time() + min(0.5 * 2**run.restarts, 5.0)
                else:
                    run.terminated = state
                run.ready = False
            if run.restart_at is not None and loop.time() >= run.restart_at:
                run.restart_at = None
                run.restarts += 1
                await self._launch(run)

    async def _probe(
        self, http: aiohttp.ClientSession, run: ContainerRun, probe: dict[str, Any]
    ) -> None:
        timeout = float(probe.get("timeoutSeconds", 1))
        passed = False
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                port = self._port(run, get["port"])
                url = (
                    f"{get.get('scheme', 'HTTP').lower()}://{get.get('host') or self.ip}:{port}"
                    f"{get.get('path', '/')}"
                )
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as answer:
                    passed = 200 <= answer.status < 400
            elif "tcpSocket" in probe:
                port = self._port(run, probe["tcpSocket"]["port"])
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(probe["tcpSocket"].get("host") or self.ip, port),
                    timeout,
                )
                writer.close()
                passed = True
            elif "exec" in probe:
                prefix, env = [], run.env
                if run.docker_name is not None and self.kubelet.docker is not None:
                    prefix = self.kubelet.docker.exec_args(run.docker_name)
                    env = dict(os.environ)
                check = await asyncio.create_subprocess_exec(
                    *prefix,
                    *probe["exec"]["command"],
                    env=env,
                    cwd=str(self.root),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                passed = await asyncio.wait_for(check.wait(), timeout) == 0
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            passed = False
        if passed:
            run.passes, run.failures = run.passes + 1, 0
            if run.passes >= int(probe.get("successThreshold", 1)):
                run.ready = True
        else:
            run.passes, run.failures = 0, run.failures + 1
            if run.failures >= int(probe.get("failureThreshold", 3)):
                run.ready = False

    @staticmethod
    def _port(run: ContainerRun, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for declared in run.spec.get("ports") or []:
            if declared.get("name") == port:
                return int(declared["containerPort"])
        raise ValueError(f"no container port named {port!r}")

    async def _terminate(self) -> None:
        """SIGTERM to each container's main process, SIGKILL for all at the deadline."""
        loop = asyncio.get_running_loop()
        for run in self.containers.values():
            run.restart_at = None
            if run.running:
                assert run.process is not None
                run.family.update(descendants(run.process.pid))
                if run.docker_name is not None and self.kubelet.docker is not None:
                    await self.kubelet.docker.signal(run.docker_name, "SIGTERM")
                    continue
                with contextlib.suppress(ProcessLookupError):
                    run.process.send_signal(signal.SIGTERM)
        while any(run.running for run in self.containers.values()):
            assert self.deadline is not None
            if loop.time() >= self.deadline:
                break
            await self._wait(min(TICK, max(self.deadline - loop.time(), 0.0)))
        for run in self.containers.values():
            await self._kill_tree(run)
            if run.process is not None and run.terminated is None:
                run.terminated = self._terminated_state(run)

    async def _kill_tree(self, run: ContainerRun) -> None:
        if run.docker_name is not None and self.kubelet.docker is not None:
            await self.kubelet.docker.remove(run.docker_name)  # killed, and gone
        if run.process is None:
            return
        if run.process.returncode is None:
            run.family.update(descendants(run.process.pid))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.process.pid, signal.SIGKILL)
        for pid in run.family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.process.pid, signal.SIGKILL)
        await run.process.wait()

    def _terminated_state(self, run: ContainerRun) -> dict[str, Any]:
        assert run.process is not None and run.process.returncode is not None
        code = run.process.returncode
        exit_code = 128 - code if code < 0 else code  # killed by a signal: 128 + signum
        message = (
            run.termination_log.read_bytes()[:MESSAGE_LIMIT].decode(errors="replace")
            if run.termination_log.exists()
            else ""
        )
        if (
            not message
            and exit_code != 0
            and run.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        ):
            lines = run.log.read_bytes().decode(errors="replace").splitlines()[-80:]
            message = "\n".join(lines)[-2048:]
        state: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": now(),
        }
        if message:
            state["message"] = message
        return state

    async def _finish(self) -> None:
        meta = self.pod["metadata"]
        with contextlib.suppress(Exception):  # gone already: nothing to confirm
            await raw.call(
                self.kubelet.api,
                "DELETE",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )

    # --- status ---------------------------------------------------------------------------

    def _status(self) -> dict[str, Any]:
        statuses = []
        for spec in self.pod["spec"]["containers"]:
            run = self.containers.get(spec["name"])
            statuses.append(self._container_status(spec, run))
        no_process = not self.kubelet.run_processes
        ready = no_process or (
            bool(self.containers)
            and all(run.ready and run.running for run in self.containers.values())
        )
        runs = list(self.containers.values())
        if no_process or any(run.running or run.restart_at is not None for run in runs):
            phase = "Running"
        elif runs and all(run.terminated is not None for run in runs):
            codes = [run.terminated["exitCode"] for run in runs if run.terminated]
            phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        else:
            phase = "Pending"
        previous = {c["type"]: c for c in (self._reported or {}).get("conditions") or []}

        def condition(kind: str, state: bool) -> dict[str, Any]:
            value = "True" if state else "False"
            before = previous.get(kind)
            since = before["lastTransitionTime"] if before and before["status"] == value else now()
            return {
                "type": kind,
                "status": value,
                "lastTransitionTime": since,
                "lastProbeTime": None,
            }

        conditions = [
            condition("PodScheduled", True),
            condition("Initialized", True),
            condition("ContainersReady", ready),
            condition("Ready", ready),
        ]
        if self.pod["spec"].get("restoreFrom") and self.restore_refused is not None:
            reason, message = self.restore_refused
            conditions.append(
                {**condition("Restoring", False), "reason": reason, "message": message}
            )
        return {
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.kubelet.nodes.get(self.node, ""),
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.started_at,
            "qosClass": "BestEffort",
            "containerStatuses": statuses,
        }

    def _container_status(self, spec: dict[str, Any], run: ContainerRun | None) -> dict[str, Any]:
        state: dict[str, Any]
        if not self.kubelet.run_processes:
            state = {"running": {"startedAt": self.started_at}}
        elif run is None or run.waiting is not None:
            reason, message = run.waiting if run and run.waiting else ("ContainerCreating", "")
            state = {"waiting": {"reason": reason, "message": message}}
        elif run.running:
            state = {"running": {"startedAt": run.started_at}}
        elif run.terminated is not None:
            state = {"terminated": run.terminated}
        else:
            state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off restarting failed container {spec['name']}",
                }
            }
        ready = not self.kubelet.run_processes or bool(run and run.ready and run.running)
        status: dict[str, Any] = {
            "name": spec["name"],
            "image": spec["image"],
            "imageID": spec["image"],
            "containerID": (
                f"docker://{run.docker_name}"
                if run is not None and run.docker_name is not None
                else f"local://{self.pod['metadata']['uid']}/{spec['name']}"
            ),
            "ready": ready,
            "started": bool(run and run.running) or not self.kubelet.run_processes,
            "restartCount": run.restarts if run else 0,
            "state": state,
        }
        if run is not None and run.last_state is not None:
            status["lastState"] = run.last_state
        return status

    async def _report(self) -> None:
        status = self._status()
        if status == self._reported:
            return
        meta = self.pod["metadata"]
        try:
            await raw.call(
                self.kubelet.api,
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                body={"status": status},
                content_type=raw.MERGE,
            )
        except Exception:  # noqa: BLE001 - the pod is gone or the API away: report later
            return
        self._reported = status


def _references(pod: dict[str, Any]) -> set[tuple[str, str]]:
    """The Secrets and ConfigMaps a pod's environment and volumes read."""
    found: set[tuple[str, str]] = set()
    spec = pod.get("spec") or {}
    for container in spec.get("containers") or []:
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                found.add(("secrets", source["secretRef"]["name"]))
            if "configMapRef" in source:
                found.add(("configmaps", source["configMapRef"]["name"]))
        for item in container.get("env") or []:
            source = item.get("valueFrom") or {}
            if "secretKeyRef" in source:
                found.add(("secrets", source["secretKeyRef"]["name"]))
            if "configMapKeyRef" in source:
                found.add(("configmaps", source["configMapKeyRef"]["name"]))
    for volume in spec.get("volumes") or []:
        sources = [volume, *((volume.get("projected") or {}).get("sources") or [])]
        for source in sources:
            if "secret" in source:
                secret = source["secret"]
                found.add(("secrets", secret.get("secretName") or secret.get("name")))
            if "configMap" in source:
                found.add(("configmaps", source["configMap"]["name"]))
    return found
