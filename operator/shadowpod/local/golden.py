"""Golden sessions on this machine: recording one from a gateway, and replaying one
against an agent image of the local image map (its command run in sandbox mode)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.reducer import fold
from shadowpod.domain.schema import load_state_json
from shadowpod.domain.state import SessionState
from shadowpod.gates.golden import GoldenFile, cut_golden
from shadowpod.gates.replay import SandboxReport
from shadowpod.local.images import LocalImage

PAGE: Final = 5000
SANDBOX_TIMEOUT_S: Final = 300.0


class GoldenError(ShadowpodError):
    """A golden session could not be recorded or replayed; says why and what to do."""

    reason = "GoldenReplayFailed"


async def record_golden(
    client: GatewayClient,
    session: str,
    *,
    from_seq: int = 1,
    to_seq: int | None = None,
    secrets: Iterable[str] = (),
    note: str = "",
) -> GoldenFile:
    """Cut ``from_seq``..``to_seq`` of ``session``'s journal, read through the gateway,
    into a golden file. The state before ``from_seq`` comes from the journal itself,
    or from the latest snapshot below it where the journal was truncated."""
    base = SessionState()
    after = 0
    if from_seq > 1:
        document = await client.snapshot_document(session)
        if document is not None and document.watermark < from_seq:
            base = load_state_json(document.document_json, schema_version=document.schema_version)
            after = document.watermark
    entries: list[JournalEntry] = []
    while True:
        page, head = await client.journal(session, after=after, limit=PAGE)
        if page and page[0].seq != after + 1:
            raise GoldenError(
                f"the journal of {session} holds no entries from {after + 1} to "
                f"{page[0].seq - 1} (truncated by retention): record from seq "
                f"{page[0].seq} or later (--from)"
            )
        entries += page
        if not page or page[-1].seq >= head or (to_seq is not None and page[-1].seq > to_seq):
            break
        after = page[-1].seq
    before = [e for e in entries if e.seq < from_seq]
    if before:
        base = fold(base.working_copy(), before)
    return cut_golden(
        base,
        [e for e in entries if e.seq >= from_seq],
        session=session,
        from_seq=from_seq,
        to_seq=to_seq,
        secrets=secrets,
        note=note,
    )


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
