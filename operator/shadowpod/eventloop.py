"""Running Shadowpod's processes on uvloop, the libuv event loop for asyncio.

The gateway, the agent runtime and the local tools spend most of their time in the
event loop and socket handling; uvloop carries the same work on noticeably less CPU,
which is what keeps a 2-core machine serving a thousand messages a second.

The garbage collector is tuned for latency. With CPython's defaults, a busy gateway
runs a full collection every few seconds; it walks every live object (the recent
journal entries it keeps for followers are tens of thousands) and stops the process
— event loop and journal commits alike — for 50 to 100 ms under load, which
was the largest part of the pause a fenced message waits. Objects alive at start-up
(modules, routes, models) are moved out of the collector's sight (``gc.freeze``) and
the first generation is collected every 20,000 allocations instead of 700, so full
collections are about 30 times rarer. Garbage without cycles is still freed at once
by reference counting; only cyclic garbage lives longer.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import signal
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

import uvloop

T = TypeVar("T")

GC_THRESHOLDS: Final = (20_000, 20, 20)
# Set by whoever starts a Shadowpod process that must not outlive it: its pid.
EXIT_WITH_PARENT_ENV: Final = "SHADOWPOD_EXIT_WITH_PARENT"
# ``asyncio`` runs a process on asyncio's own loop instead of uvloop: an agent that is
# to be checkpointed by CRIU needs it (see ``shadowpod.agent.checkpoint``).
EVENT_LOOP_ENV: Final = "SHADOWPOD_EVENT_LOOP"
_PR_SET_PDEATHSIG: Final = 1


def exit_with_parent() -> None:
    """If ``SHADOWPOD_EXIT_WITH_PARENT`` names this process's parent, ask the kernel
    for SIGTERM when that parent dies, however it dies (Linux; elsewhere nothing).

    A local deployment starts its gateway and agents with it: a ``shadowpod demo``
    killed with SIGKILL then leaves nothing running — each process gets the SIGTERM
    it handles anyway (drain, stop background work, exit). Not passed on to children.
    """
    expected = os.environ.pop(EXIT_WITH_PARENT_ENV, None)
    if not expected:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != expected:  # the parent died before we asked
        os.kill(os.getpid(), signal.SIGTERM)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class Terminated(SystemExit):
    """SIGTERM stopped the run (after its clean-up ran); exits 143, as the signal would."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def run(main: Coroutine[Any, Any, T], *, terminate_gracefully: bool = False) -> T:
    """``asyncio.run`` on a uvloop event loop (asyncio's own with
    ``SHADOWPOD_EVENT_LOOP=asyncio``), with the collector tuned for latency.

    ``terminate_gracefully``: SIGTERM cancels ``main`` as Ctrl-C does, so its clean-up
    runs — a command that started a gateway and agent processes stops them instead of
    leaving them orphaned — and then raises ``Terminated``. (Servers handle SIGTERM
    themselves, to drain.)
    """
    tune_gc()
    runner = asyncio.run if os.environ.get(EVENT_LOOP_ENV) == "asyncio" else uvloop.run
    if not terminate_gracefully:
        return runner(main)
    terminated = False

    async def until_terminated() -> T:
        task = asyncio.current_task()
        assert task is not None

        def terminate() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate)
        return await main

    try:
        return runner(until_terminated())
    except asyncio.CancelledError:
        if terminated:
            raise Terminated() from None
        raise
