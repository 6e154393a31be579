"""Starting a gateway process: a slow readiness answer is waited for, not a failure.

Found by the crash campaign on PostgreSQL: a gateway restarted on a busy machine took
more than the probe's 1 s to answer its first ``/readyz``, and the start failed with a
bare ``TimeoutError`` although the gateway came up.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web

from shadowpod.local.gateway_process import GatewayProcess, free_port, port_free


async def test_a_gateway_slow_to_answer_its_first_readiness_probe_is_waited_for(
    tmp_path: Path,
) -> None:
    probes = 0

    async def readyz(request: web.Request) -> web.Response:
        nonlocal probes
        probes += 1
        if probes == 1:
            await asyncio.sleep(1.5)  # longer than one probe waits
        return web.json_response({"ready": True})

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app)
    await runner.setup()
    gateway = GatewayProcess(tmp_path, port=free_port())
    await web.TCPSite(runner, gateway.host, gateway.port).start()
    # A process that runs, standing for the gateway's while this server answers for it.
    gateway.process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(30)"
    )
    try:
        await gateway._wait_ready()
        assert probes >= 2
    finally:
        gateway.process.kill()
        await gateway.process.wait()
        await runner.cleanup()


async def test_the_port_of_a_stopped_gateway_is_free_for_the_next_one(tmp_path: Path) -> None:
    """``shadowpod up`` started again serves on the port it had (its session's URL) when
    that port is free. The connections the stopped gateway closed itself linger in
    TIME_WAIT on that port; they did not keep a server from it, but the probe, bound
    without ``SO_REUSEADDR``, said the port was taken, and ``up`` moved elsewhere."""
    first = GatewayProcess(tmp_path / "a", port=free_port())
    await first.start()
    # A client's keep-alive connection, idle when the gateway stops: the gateway closes it.
    reader, writer = await asyncio.open_connection(first.host, first.port)
    writer.write(f"GET /readyz HTTP/1.1\r\nHost: {first.host}\r\n\r\n".encode())
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    await first.stop()
    await asyncio.wait_for(reader.read(), 10)  # until the server's close reached it
    writer.close()
    assert port_free(first.port)
    again = GatewayProcess(tmp_path / "b", port=first.port)
    await again.start()
    await again.stop()
