"""``shadowpod golden``: record a golden session from a gateway, and replay one against
an agent image offline — the upgrade gate a CI pipeline calls before deploying.

Exit codes of ``replay``: 0 the gate passed, 1 it failed (the report says which turns
and why), 2 it could not run (a bad file, policy or image, an agent that crashed).
``record``: 0 written, 2 it could not record.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from shadowpod import eventloop
from shadowpod.cli.errors import fail
from shadowpod.client.gateway import GatewayClient
from shadowpod.client.goldens import record_golden
from shadowpod.domain.errors import ShadowpodError
from shadowpod.gates.gate import build_judge, chat_model, evaluate
from shadowpod.gates.golden import GoldenFile
from shadowpod.gates.llm import JudgeUnavailable
from shadowpod.gates.openai_http import OpenAIChatModel
from shadowpod.gates.policy import GatePolicy
from shadowpod.gates.replay import SandboxReport, pairs_of
from shadowpod.gates.semantic import SemanticUnavailable
from shadowpod.gates.verdicts import GateVerdict
from shadowpod.local.golden import replay_in_sandbox
from shadowpod.local.images import ImageMap, reference_images


@click.group("golden", context_settings={"help_option_names": ["-h", "--help"]})
def golden() -> None:
    """Golden sessions: record real turns, replay them against a new version."""


def _lines(path: Path | None) -> list[str]:
    if path is None:
        return []
    try:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {path}: {exc}", 2)


@golden.command("record")
@click.option("--gateway", "gateway_url", default="http://127.0.0.1:8800", show_default=True)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A token that may read the session's journal (control or the session's agent token).",
)
@click.option("--session", required=True, help="The session whose journal to cut.")
@click.option("--from", "from_seq", type=click.IntRange(1), default=1, show_default=True)
@click.option("--to", "to_seq", type=click.IntRange(1), default=None, help="Default: the head.")
@click.option(
    "--secret-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Values to redact wherever they appear, one per line (besides known secret shapes).",
)
@click.option("--note", default="", help="Why this golden exists, kept in its header.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True)
def record(
    gateway_url: str,
    token_file: Path | None,
    session: str,
    from_seq: int,
    to_seq: int | None,
    secret_file: Path | None,
    note: str,
    output: Path,
) -> None:
    """Cut a slice of a session's journal into a golden file (JSON Lines)."""
    tokens = _lines(token_file)
    token = tokens[0] if tokens else None
    secrets = [*tokens, *_lines(secret_file)]

    async def run() -> GoldenFile:
        async with GatewayClient(gateway_url, token) as client:
            return await record_golden(
                client, session, from_seq=from_seq, to_seq=to_seq, secrets=secrets, note=note
            )

    try:
        cut = eventloop.run(run())
    except ShadowpodError as exc:
        fail(f"cannot record {session}: {exc}", 2)
    except OSError as exc:
        fail(f"cannot reach the gateway at {gateway_url}: {exc}", 2)
    try:
        cut.write(output)
    except OSError as exc:
        fail(f"cannot write {output}: {exc}", 2)
    turns = sum(1 for e in cut.entries if e.epoch == 0 and e.kind in ("message", "schedule"))
    click.echo(
        f"wrote {output}: seqs {cut.header.from_seq}-{cut.header.to_seq} of {session}, "
        f"{len(cut.entries)} entries, {turns} inbound, {cut.header.redacted} secret(s) redacted"
    )


@golden.command("replay")
@click.argument("golden_path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--image", required=True, help="The agent image to test, from the image map.")
@click.option(
    "--images",
    "images_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Local image map (YAML). Default: the reference agent's images.",
)
@click.option("--policy", "policy_path", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--judge",
    type=click.Choice(["exact", "normalised", "tool_calls", "semantic", "llm"]),
    default=None,
    help="Overrides the policy's judge.",
)
@click.option("--agreement", type=click.FloatRange(0, 1), default=None)
@click.option("--similarity", type=click.FloatRange(0, 1), default=None)
@click.option("--json", "as_json", is_flag=True, help="The verdict as JSON on stdout.")
def replay(
    golden_path: Path,
    image: str,
    images_path: Path | None,
    policy_path: Path | None,
    judge: str | None,
    agreement: float | None,
    similarity: float | None,
    as_json: bool,
) -> None:
    """Replay a golden file against an agent image and judge its answers."""
    try:
        policy = GatePolicy.load(policy_path) if policy_path else GatePolicy()
        overrides = {"judge": judge, "agreement": agreement, "similarity": similarity}
        policy = GatePolicy.model_validate(
            {**policy.model_dump(), **{k: v for k, v in overrides.items() if v is not None}}
        )
        images = ImageMap.load(images_path) if images_path else reference_images()
        local_image = images.resolve(image)
        recorded = GoldenFile.read(golden_path)
    except (ValueError, ShadowpodError) as exc:
        fail(str(exc), 2)

    async def run() -> tuple[GateVerdict, SandboxReport]:
        report = await replay_in_sandbox(local_image, golden_path)
        pairs = pairs_of(recorded, report)
        chat: OpenAIChatModel | None = chat_model(policy) if policy.judge == "llm" else None
        try:
            chosen = build_judge(policy, agent_patterns=report.nondeterministic, chat=chat)
            return await evaluate(policy, chosen, pairs), report
        finally:
            if chat is not None:
                await chat.close()

    try:
        verdict, report = eventloop.run(run())
    except (ShadowpodError, ValueError, SemanticUnavailable, JudgeUnavailable) as exc:
        fail(str(exc), 2)
    if as_json:
        click.echo(json.dumps(_as_json(verdict, report, image)))
    else:
        _print_report(verdict, report, image)
    raise SystemExit(0 if verdict.passed else 1)


def _as_json(verdict: GateVerdict, report: SandboxReport, image: str) -> dict[str, object]:
    return {
        "image": image,
        "agent": f"{report.agent} v{report.version}",
        "passed": verdict.passed,
        "judge": verdict.judge,
        "compared": verdict.compared,
        "agreed": verdict.agreed,
        "agreement": verdict.agreement,
        "threshold": verdict.threshold,
        "turns": [v.model_dump() for v in verdict.turns],
        "refused": {a.turn: a.refused for a in report.answers if a.refused},
    }


def _print_report(verdict: GateVerdict, report: SandboxReport, image: str) -> None:
    console = Console(highlight=False, soft_wrap=True)
    style = "green" if verdict.passed else "red"
    console.print(f"{image} ({report.agent} v{report.version}): ", end="")
    console.print(verdict.summary(), style=style)
    worst = verdict.worst()
    if worst:
        table = Table(title="worst disagreements", show_lines=True)
        for column in ("turn", "expected", "got", "why"):
            table.add_column(column, overflow="fold")
        for turn in worst:
            table.add_row(str(turn.turn), turn.expected, turn.got, turn.reason)
        console.print(table)
    refused = [f"turn {a.turn}: {r}" for a in report.answers for r in a.refused]
    if refused:
        console.print(f"side effects refused in the sandbox: {'; '.join(refused)}")
