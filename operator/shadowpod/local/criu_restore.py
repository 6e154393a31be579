"""The first process of a restored instance: ``criu restore`` in a place of its own.

    unshare --pid --mount --fork --mount-proc \\
        python -m shadowpod.local.criu_restore --images DIR --bind NEW:OLD [--bind ...]

``shadowpod.local.criu`` runs it as an instance's process. In its own pid namespace
(CRIU gives a restored process back its pid, which the source still uses) and mount
namespace, it stands in for a pod: it mounts the new instance's identity directory
over the path the checkpointed process reads its identity from (``--bind``), as a
pod's volume would be at the same path with other contents; restores the process;
deletes the checkpoint (it holds every memory page of the agent); continues the
process (it was checkpointed stopped); and then, as the namespace's init, passes
SIGTERM and SIGINT on to it, reaps, and exits with its exit code. When it exits, the
kernel ends whatever else is left in the namespace.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, required=True, help="the CRIU checkpoint")
    parser.add_argument("--bind", action="append", default=[], help="NEW:OLD, mounted")
    parser.add_argument("--criu", default="criu")
    parser.add_argument("--termination-log", type=Path, help="why it failed, if it did")
    args = parser.parse_args(argv)
    try:
        for pair in args.bind:
            new, _, old = pair.partition(":")
            subprocess.run(["mount", "--bind", new, old], check=True, capture_output=True)
        pid = _restore(args.criu, args.images)
    except (OSError, subprocess.CalledProcessError, RestoreFailed) as exc:
        message = f"restoring the checkpoint failed: {_describe(exc)}"
        print(f"error: {message}", file=sys.stderr)
        if args.termination_log is not None:
            args.termination_log.write_text(message + "\n")
        return 1
    finally:
        shutil.rmtree(args.images, ignore_errors=True)

    def forward(signum: int, _: FrameType | None) -> None:
        os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    os.kill(pid, signal.SIGCONT)
    while True:
        try:
            waited, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if waited == pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


class RestoreFailed(Exception):
    pass


def _restore(criu: str, images: Path) -> int:
    """``criu restore``, detached; the restored process's pid (in this namespace)."""
    pidfile = images / "restored.pid"
    command = [criu, "restore", "-D", str(images), "--shell-job", "-d"]
    command += ["--pidfile", str(pidfile), "-o", "restore.log"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RestoreFailed(_errors(images / "restore.log") or done.stderr.strip())
    return int(pidfile.read_text().strip())


def _errors(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "; ".join(line.strip() for line in lines if "Error" in line)[-800:]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        detail = exc.stderr.decode(errors="replace").strip() if exc.stderr else ""
        return f"{' '.join(map(str, exc.cmd))}: exit {exc.returncode} {detail}".strip()
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
