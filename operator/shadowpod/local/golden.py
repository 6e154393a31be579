"""Golden sessions on this machine: replaying one against an agent image of the local
image map (its command run in sandbox mode, offline). Recording one is
``shadowpod.client.goldens``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from shadowpod.client.goldens import GoldenError
from shadowpod.gates.replay import SandboxReport
from shadowpod.local.images import LocalImage

__all__ = ["GoldenError", "replay_in_sandbox"]
SANDBOX_TIMEOUT_S: Final = 300.0


def _sandbox_env(image: LocalImage, golden_path: Path, report_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        **image.env,
        "SHADOWPOD_SANDBOX_GOLDEN": str(golden_path.resolve()),
        "SHADOWPOD_SANDBOX_REPORT": str(report_path),
        "SHADOWPOD_LOG_FORMAT": "text",
        "SHADOWPOD_LOG_LEVEL": "warning",
    }


async def replay_in_sandbox(
    image: LocalImage, golden_path: Path, *, timeout_s: float = SANDBOX_TIMEOUT_S
) -> SandboxReport:
    """Run ``image``'s agent in sandbox mode over the golden file; its report."""
    with tempfile.TemporaryDirectory(prefix="shadowpod-sandbox-") as workdir:
        report_path = Path(workdir) / "report.json"
        env = _sandbox_env(image, golden_path, report_path)
        process = await asyncio.create_subprocess_exec(
            *image.command,
            env=env,
            cwd=workdir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
        except TimeoutError:
            process.kill()
            with contextlib.suppress(ProcessLookupError):
                await process.wait()
            raise GoldenError(
                f"the agent did not finish the golden replay in {timeout_s:.0f} s"
            ) from None
        if process.returncode != 0:
            tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
            raise GoldenError(
                f"the agent exited with code {process.returncode} in sandbox mode: "
                + (" / ".join(tail) or "no output")
            )
        try:
            return SandboxReport.model_validate_json(report_path.read_bytes())
        except (OSError, ValidationError) as exc:
            raise GoldenError(
                f"the agent wrote no sandbox report ({exc}): is it built on shadowpod.agent "
                "and started with agent.run()?"
            ) from exc
