"""A checkpoint of a serving agent: a forked copy of the process, made dumpable, that
CRIU can take away while the agent itself goes on serving.

CRIU freezes what it dumps, and CRIU 4.1 cannot dump a TCP socket at all on Linux
6.16 and later (the kernel refuses ``SO_PASSCRED`` on it; criu#2718). So the agent
does not hand CRIU itself: at the checkpoint request it forks. The child has the
parent's memory as it was at that instant — the state folded up to the watermark the
request answers with, every cache, every object — and makes itself independent of
the parent and of the network before it stops itself (SIGSTOP) for the dump:

- every file descriptor that leads out of it — a TCP connection, the listening
  socket, a pidfd of a background process (the parent's, not its own) — is
  replaced by a stand-in of the same number: a connection by a socket whose peer is
  closed (after a restore it reads as the connection that died with the dump), a
  listener or a pidfd by a listening Unix socket nobody connects to;
- the event loop's epoll, which a fork shares with the parent, is replaced by a
  private copy with the same interest list, so the parent's events are not the
  child's and CRIU dumps what the child will wait on;
- what the interpreter resets in a forked child (asyncio's running loop, the signal
  wake-up descriptor) is set back, and the default executor is forgotten (its
  threads did not survive the fork).

The parent never pauses beyond the fork itself (the page tables are copied, not the
memory). The child waits stopped until CRIU has dumped it (and killed it) — or, in
a restored copy, until the restorer continues it: ``fork_for_checkpoint`` then
returns 0 in a process that is somewhere else, and the runtime relocates.

The event loop must be asyncio's own (``SHADOWPOD_EVENT_LOOP=asyncio``): uvloop's
libuv keeps an io_uring that CRIU cannot dump, and an epoll it does not let us
rebuild.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import signal
import socket
import struct
import warnings
from pathlib import Path
from typing import Final

_EPOLL_CTL_ADD: Final = 1
_EPOLL_CLOEXEC: Final = 0o2000000


class CheckpointUnsupported(Exception):
    """This process cannot be made into a checkpoint (the reason says why)."""


def fork_for_checkpoint(loop: asyncio.AbstractEventLoop, output: Path | None) -> int:
    """Fork a stopped, dumpable copy of this process; the child's pid in the parent.

    Returns 0 in the copy once it is continued (after a CRIU restore): it runs on
    from here, its stdout and stderr on ``output`` (``/dev/null`` if not given).
    Must be called from the event loop's thread, with no ``await`` between the check
    that no turn is running and this call.
    """
    if type(loop).__module__.startswith("uvloop"):
        raise CheckpointUnsupported(
            "this agent runs on uvloop, whose io_uring CRIU cannot dump: start it with "
            "SHADOWPOD_EVENT_LOOP=asyncio to make it checkpointable"
        )
    # Opened before the fork: a failure is the parent's to report, not a lost child's.
    sink = os.open(output or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with warnings.catch_warnings():
            # "This process is multi-threaded, use of fork() may lead to deadlocks":
            # the child runs only this module's code until it is continued, and after
            # that it makes new threads, never waits for the old ones.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid:
            return pid
        try:
            os.dup2(sink, 1)
            os.dup2(sink, 2)
            _isolate()
            _repair_asyncio(loop)
        except Exception:  # noqa: BLE001 - a forked child must never return into the loop
            os._exit(70)  # nothing to dump: the parent's caller sees the child gone
        os.kill(os.getpid(), signal.SIGSTOP)
        return 0
    finally:
        with contextlib.suppress(OSError):
            os.close(sink)


def _descriptors() -> dict[int, str]:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return found


def _socket_kind(fd: int) -> tuple[bool, bool] | None:
    """(is it an Internet socket, is it listening), or ``None`` for a non-socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        internet = sock.family in (socket.AF_INET, socket.AF_INET6)
        listening = bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        return internet, listening
    except OSError:
        return None
    finally:
        sock.detach()  # it was only looked at: the descriptor stays as it is


def _quiet() -> socket.socket:
    """A stand-in no event ever comes from: a listening Unix socket nobody knows."""
    stand_in = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stand_in.bind(b"\0shadowpod-checkpoint-" + os.urandom(8).hex().encode())
    stand_in.listen()
    return stand_in


def _dead() -> socket.socket:
    """A stand-in for a connection: its peer is closed, so it reads end-of-file."""
    stand_in, peer = socket.socketpair()
    peer.close()
    return stand_in


def _isolate() -> None:
    for fd, target in _descriptors().items():
        stand_in: socket.socket | None = None
        if target.startswith("socket:"):
            kind = _socket_kind(fd)
            if kind is not None and kind[0]:
                stand_in = _quiet() if kind[1] else _dead()
        elif target == "anon_inode:[pidfd]":
            stand_in = _quiet()
        if stand_in is not None:
            os.dup2(stand_in.fileno(), fd, inheritable=False)
            stand_in.close()
    for fd, target in _descriptors().items():
        if target == "anon_inode:[eventpoll]":
            _private_epoll(fd)


def _private_epoll(fd: int) -> None:
    """Replace epoll ``fd`` (shared with the parent since the fork) by a new one with
    the same interest list, read from ``/proc/self/fdinfo``; each entry's data word is
    kept as it was (selectors and libuv store the descriptor there).

    The parent goes on serving meanwhile, on the same interest list: an entry it added
    after the fork names a descriptor this copy does not have (``EBADF``), or one it
    has too under the same number (``EEXIST`` once listed twice). Neither is the
    copy's to wait on; it is left out."""
    entries = []
    with open(f"/proc/self/fdinfo/{fd}") as info:
        for line in info:
            if line.startswith("tfd:"):
                fields = line.split()
                entries.append((int(fields[1]), int(fields[3], 16), int(fields[5], 16)))
    libc = ctypes.CDLL(None, use_errno=True)
    private = libc.epoll_create1(_EPOLL_CLOEXEC)
    if private < 0:
        raise OSError(ctypes.get_errno(), "epoll_create1")
    try:
        for target, events, data in entries:
            event = ctypes.create_string_buffer(struct.pack("=IQ", events, data))
            if libc.epoll_ctl(private, _EPOLL_CTL_ADD, target, event) != 0:
                error = ctypes.get_errno()
                if error in (errno.EBADF, errno.EEXIST):
                    continue
                raise OSError(error, f"epoll_ctl ADD {target}")
        os.dup2(private, fd, inheritable=False)
    finally:
        os.close(private)


def _repair_asyncio(loop: asyncio.AbstractEventLoop) -> None:
    """Undo what Python resets in a forked child: this child goes on running ``loop``."""
    asyncio.events._set_running_loop(loop)
    asyncio.set_event_loop(loop)
    if isinstance(loop, asyncio.BaseEventLoop):
        loop._default_executor = None  # type: ignore[attr-defined]
    wakeup = getattr(loop, "_csock", None)
    if wakeup is not None and getattr(loop, "_signal_handlers", None):
        signal.set_wakeup_fd(wakeup.fileno(), warn_on_full_buffer=False)
