"""`shadowpod bench cluster` on the emulator: its watches and its figures.

What a user of the benchmark would notice going wrong: a reaction time that is the
length of a broken watch rather than the operator's (an owner pod made while the
benchmark's watch was away, timed when the watch came back), sessions that never get
Running, an image change that finds no AgentMigration, or live moves whose times are
missing from the report."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest

from shadowpod.bench.cluster import Cluster, ClusterBenchConfig, Timeline, run_cluster_bench
from shadowpod.kube import names
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.kube.handlers import api_client
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.kubelet import Kubelet
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(300)


class CuttableLink:
    """A TCP relay on 127.0.0.1 to ``port``, which can be cut: every open connection
    closed and new ones refused until it is mended (a network break between the
    benchmark and the API server)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cut = False
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> CuttableLink:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.sever()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def sever(self) -> None:
        self.cut = True
        for writer in list(self._open):
            writer.close()
        self._open.clear()

    def mend(self) -> None:
        self.cut = False

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._open |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._open -= {writer, up_writer}


@contextlib.asynccontextmanager
async def small_window_emulator(tmp_path: Path) -> AsyncIterator[ApiServerEmulator]:
    """An API server that keeps only its last 3 changes for watches to resume from."""
    async with ApiServerEmulator(watch_window=3) as server, kmock.Server(server):
        yield server
    assert server.internal_errors == []


def port_of(server: ApiServerEmulator) -> int:
    port = server.url.port
    assert port is not None
    return port


def owner_pod(session: str) -> dict[str, object]:
    return {
        "metadata": {"name": f"{session}-owner", "labels": names.owner_selector(session)},
        "spec": {"containers": [{"name": "agent", "image": "shadowpod-refagent:v1"}]},
    }


async def test_an_owner_pod_made_while_the_watch_was_cut_is_not_timed_at_its_return(
    tmp_path: Path,
) -> None:
    """The watch comes back after more changes than the server keeps: what it missed
    is listed again, and counted by the API server's timestamps only — not timed as
    if the operator had made those pods the moment the link came back."""
    async with small_window_emulator(tmp_path) as server, CuttableLink(port_of(server)) as link:
        for side in ("direct", "relayed"):
            (tmp_path / side).mkdir()
        direct = KubeConnection.to_emulator(str(server.url).rstrip("/"), tmp_path / "direct")
        relayed = KubeConnection.to_emulator(link.url, tmp_path / "relayed")
        pods = namespaced("pods", "default")
        timeline = Timeline()
        async with (
            await api_client(str(direct.kubeconfig)) as direct_client,
            await api_client(str(relayed.kubeconfig)) as relayed_client,
        ):
            maker = KubeApi(direct_client)
            cluster = Cluster(KubeApi(relayed_client), "default")
            watch = asyncio.create_task(cluster.watch("pods", timeline.on_pod))
            try:
                await asyncio.sleep(0.5)  # its list made, its watch open
                await maker.create(pods, owner_pod("live"))
                await eventually(lambda: "live" in timeline.owner_pod)

                link.sever()
                await eventually(lambda: cluster.watch_breaks)
                for n in range(5):  # more changes than the server keeps
                    await maker.create(pods, owner_pod(f"gap-{n}"))
                await asyncio.sleep(1.5)  # the watch tries again, and is refused
                link.mend()
                await eventually(lambda: "gap-4" in timeline.owner_pod_created, timeout=20)
                await maker.create(pods, owner_pod("after"))
                await eventually(lambda: "after" in timeline.owner_pod, timeout=20)
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch

    gap = {f"gap-{n}" for n in range(5)}
    # Every pod counted by its creationTimestamp; only those seen as they came, timed.
    assert gap | {"live", "after"} <= timeline.owner_pod_created.keys()
    assert set(timeline.owner_pod) == {"live", "after"}


async def test_the_bench_measures_creation_and_live_moves_of_real_agents(
    emulator_kube: KubeConnection, kubelet: Kubelet, tmp_path: Path
) -> None:
    """Two sessions of the reference agent (run by the kubelet stand-in) made and
    Running, then moved live to v2: each move made, succeeded and timed."""
    out = tmp_path / "cluster.json"
    config = ClusterBenchConfig(
        kubeconfig=emulator_kube.kubeconfig,
        gateway_host="127.0.0.1",
        sessions=2,
        rate=5.0,
        parts=frozenset({"image-change"}),
        bump_image="shadowpod-refagent:v2",
        timeout_s=180.0,
        workdir=tmp_path / "work",
        out=out,
    )
    report = await run_cluster_bench(config)

    assert report["complete"] and json.loads(out.read_text())["complete"]
    reaction = report["reaction"]
    assert reaction["all_running"], reaction
    assert reaction["create_to_owner_pod_s"]["n"] == 2
    assert reaction["create_to_running_by_ready_condition_s"]["n"] == 2
    assert reaction["sessions_bumped"] == 2
    assert reaction["migrations_ended"] == {"Succeeded": 2}, reaction
    assert reaction["image_change_to_migration_s"]["n"] == 2
    for figure in ("migration_s", "image_change_to_succeeded_s", "fencing_ms"):
        assert reaction[figure]["n"] == 2, (figure, reaction[figure])
    # A move ends after it starts, and no sooner than it was asked for.
    assert 0 < reaction["migration_s"]["p50"] <= reaction["image_change_to_succeeded_s"]["p50"]
