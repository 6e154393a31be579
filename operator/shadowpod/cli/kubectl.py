"""``kubectl shadowpod`` (installed as ``kubectl-shadowpod``; also ``shadowpod kubectl``):
status, migrate (``--wait`` shows the phases as they pass), fork, cancel, history (with
``--gateway``, the journal's: owners, fences, suspends, wakes, resumes, snapshots), logs, diff,
and ``rollout status|pause|resume|abort|history`` of an AgentDeployment.

Exit codes: 0 done (a waited migration succeeded; ``diff``: the gate passed; ``rollout
status``: the rollout is not halted), 1 a waited migration did not succeed (``diff``:
the gate failed; ``rollout status``: it halted), 2 bad usage or something not found, 3
the API server could not be reached.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from shadowpod.cli.errors import fail
from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.record import Phase

T = TypeVar("T")
NOT_FOUND = 2
UNREACHABLE = 3
NOT_SUCCEEDED = 1
# The phases of a live migration, in order, for the progress bar.
PROGRESS = [
    "Pending",
    "Preflight",
    "Snapshotting",
    "Restoring",
    "CatchingUp",
    "Fencing",
    "Committed",
    "Draining",
    "Succeeded",
]


def _run(target: Any, work: Callable[[Any, str], Awaitable[T]]) -> T:
    from shadowpod.kube import plugin

    async def main() -> T:
        async with plugin.connect(target) as (api, namespace):
            return await work(api, namespace)

    try:
        return asyncio.run(main())
    except plugin.KubeconfigUnusable as exc:
        fail(str(exc), UNREACHABLE)
    except LookupError as exc:
        fail(str(exc), NOT_FOUND)
    except ShadowpodError as exc:
        fail(f"the API server refused or did not answer: {exc}", UNREACHABLE)
    except OSError as exc:
        fail(f"cannot reach the API server: {exc}", UNREACHABLE)


@click.group("kubectl", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-n", "--namespace", default=None, help="Default: the kubeconfig context's.")
@click.option("--kubeconfig", envvar="KUBECONFIG", default=None)
@click.option("--context", default=None, help="The kubeconfig context to use.")
@click.pass_context
def kubectl(
    ctx: click.Context, namespace: str | None, kubeconfig: str | None, context: str | None
) -> None:
    """Shadowpod's sessions and migrations on a cluster (a kubectl plugin)."""
    from shadowpod.kube.plugin import Target

    ctx.obj = Target(kubeconfig=kubeconfig, context=context, namespace=namespace)


@kubectl.command()
@click.argument("session", required=False)
@click.pass_obj
def status(target: Any, session: str | None) -> None:
    """Sessions: phase, image, epoch, owner, readiness, their migration."""
    from shadowpod.kube import plugin

    found = _run(target, lambda api, ns: plugin.sessions(api, ns, session))
    if session is not None and not found:
        fail(f"AgentSession {session!r} not found", NOT_FOUND)
    table = Table("SESSION", "PHASE", "IMAGE", "EPOCH", "OWNER", "READY", "MIGRATION", "LAST")
    for body in found:
        st = body.get("status") or {}
        ready = next((c["status"] for c in st.get("conditions", []) if c["type"] == "Ready"), "?")
        last = st.get("lastMigration") or {}
        table.add_row(
            body["metadata"]["name"],
            st.get("phase", "Pending"),
            st.get("image") or body["spec"]["image"],
            str(st.get("epoch", "")),
            st.get("ownerPod") or "",
            ready,
            st.get("activeMigration") or "",
            f"{last.get('name', '')} {last.get('result', '')}".strip(),
        )
    Console().print(table)


@kubectl.command()
@click.argument("session")
@click.option("--image", default=None, help="Move to this image (default: the same image).")
@click.option("--node", default=None, help="Move to this node (default: any other).")
@click.option("--wait/--no-wait", default=False, help="Follow the phases until it ends.")
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(1))
@click.pass_obj
def migrate(
    target: Any, session: str, image: str | None, node: str | None, wait: bool, timeout: float
) -> None:
    """Move SESSION live: to a new image, another node, or anywhere else."""
    from shadowpod.kube import plugin

    async def work(api: Any, ns: str) -> dict[str, Any] | None:
        created = await plugin.migrate(api, ns, session, image=image, node=node)
        name = created["metadata"]["name"]
        click.echo(f"agentmigration/{name} created")
        if not wait:
            return None
        return await _follow(api, ns, name, timeout)

    finished = _run(target, work)
    if finished is not None:
        status_ = finished.get("status") or {}
        if status_.get("result") != "Succeeded":
            fail(
                f"{status_.get('result', 'unfinished')}: {status_.get('message', '')}",
                NOT_SUCCEEDED,
            )
        pause = status_.get("fencePauseMilliseconds")
        click.echo(f"Succeeded; fence pause {pause if pause is not None else 'none'} ms")


async def _follow(api: Any, namespace: str, name: str, timeout: float) -> dict[str, Any] | None:
    from shadowpod.kube import plugin

    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as progress:
        bar = progress.add_task(name, total=len(PROGRESS) - 1)
        while time.monotonic() < deadline:
            body = await plugin.migration(api, namespace, name)
            if body is None:
                return None
            phase = (body.get("status") or {}).get("phase", "Pending")
            done = PROGRESS.index(phase) if phase in PROGRESS else progress.tasks[0].completed
            progress.update(bar, completed=done, description=f"{name}: {phase}")
            if (body.get("status") or {}).get("result"):
                return body
            await asyncio.sleep(0.5)
    fail(f"agentmigration/{name} did not finish within {timeout:g} s", NOT_SUCCEEDED)
    return None


@kubectl.command()
@click.argument("session")
@click.argument("name")
@click.option("--seq", type=click.IntRange(0), default=None, help="Fork at this journal seq.")
@click.option(
    "--snapshot",
    type=click.IntRange(0),
    default=None,
    help="Fork at the snapshot of this watermark.",
)
@click.option("--image", default=None, help="The fork's image (default: the session's).")
@click.pass_obj
def fork(
    target: Any, session: str, name: str, seq: int | None, snapshot: int | None, image: str | None
) -> None:
    """Fork SESSION into a new session NAME: SESSION's state at --seq (or --snapshot),
    its own journal from there on; SESSION is untouched and keeps serving."""
    from shadowpod.kube import plugin

    if (seq is None) == (snapshot is None):
        fail("give exactly one of --seq and --snapshot: where the fork starts", NOT_FOUND)

    async def work(api: Any, ns: str) -> dict[str, Any]:
        return await plugin.fork(api, ns, session, name, seq=seq, snapshot=snapshot, image=image)

    created = _run(target, work)
    point = f"seq {seq}" if seq is not None else f"snapshot {snapshot}"
    click.echo(f"agentsession/{created['metadata']['name']} created (fork of {session} at {point})")


@kubectl.command()
@click.argument("migration")
@click.pass_obj
def cancel(target: Any, migration: str) -> None:
    """Cancel MIGRATION: it rolls back unless the new owner already took over."""
    from shadowpod.kube import plugin

    if not _run(target, lambda api, ns: plugin.cancel(api, ns, migration)):
        fail(f"AgentMigration {migration!r} not found", NOT_FOUND)
    click.echo(f"agentmigration/{migration} cancelled (it rolls back before it goes)")


@kubectl.command()
@click.argument("session")
@click.option(
    "--gateway",
    envvar="SHADOWPOD_GATEWAY_URL",
    default=None,
    help="The gateway's URL: also show what the session's journal records (owners and"
    " their epochs, fences, suspends, wakes, resumes, snapshots) with seqs and times.",
)
@click.option(
    "--token",
    envvar="SHADOWPOD_CLIENT_TOKEN",
    default=None,
    help="A client token for the gateway, if it asks for one.",
)
@click.pass_obj
def history(target: Any, session: str, gateway: str | None, token: str | None) -> None:
    """SESSION's migrations, oldest first; with --gateway, its journal's history too."""
    from shadowpod.kube import plugin

    found = _run(target, lambda api, ns: plugin.history(api, ns, session))
    table = Table("MIGRATION", "REASON", "TARGET", "PHASE", "RESULT", "DURATION", "FENCE PAUSE")
    for body in found:
        st = body.get("status") or {}
        spec = body["spec"]
        total = sum((p.get("durationMilliseconds") or 0) for p in st.get("phases", []))
        pause = st.get("fencePauseMilliseconds")
        table.add_row(
            body["metadata"]["name"],
            spec.get("reason", ""),
            spec["target"].get("image") or spec["target"].get("nodeName", ""),
            st.get("phase", Phase.PENDING.value),
            st.get("result") or "",
            f"{total / 1000:.2f} s" if st.get("phases") else "",
            "" if pause is None else f"{pause} ms",
        )
    Console().print(table)
    if gateway is not None:
        namespace = _run(target, lambda _, ns: _namespace(ns))
        Console().print(_journal_history(gateway, token, f"{namespace}.{session}"))


async def _namespace(namespace: str) -> str:
    return namespace


def _journal_history(url: str, token: str | None, session: str) -> Table:
    """The gateway's history of the session (every page of it), as a table."""
    from shadowpod.client.gateway import GatewayClient, GatewayError

    async def pages() -> list[Any]:
        events: list[Any] = []
        async with GatewayClient(url, token) as client:
            after = -1
            page = await client.history(session)
            while True:
                events += page.events
                if page.next_after >= page.head or page.next_after == after:
                    return events
                after = page.next_after
                page = await client.history(session, after=after)

    try:
        events = asyncio.run(pages())
    except GatewayError as exc:
        code = NOT_FOUND if exc.status == 404 else UNREACHABLE
        fail(f"the gateway answered {exc.status} {exc.reason}: {exc}", code)
    except OSError as exc:
        fail(f"cannot reach the gateway at {url}: {exc}", UNREACHABLE)
    table = Table("SEQ", "TIME", "EVENT", "EPOCH", "OWNER", "REASON")
    for event in events:
        table.add_row(
            str(event.seq),
            event.at,
            event.event,
            "" if event.epoch is None else str(event.epoch),
            event.owner or "",
            event.reason or "",
        )
    return table


@kubectl.command()
@click.argument("session")
@click.pass_obj
def logs(target: Any, session: str) -> None:
    """Where SESSION's logs are: the kubectl commands for each of its pods."""
    from shadowpod.kube import plugin

    found = _run(target, lambda api, ns: _pods_and_namespace(plugin, api, ns, session))
    namespace, pods = found
    if not pods:
        fail(f"no pods of session {session!r} in namespace {namespace!r}", NOT_FOUND)
    for pod in pods:
        role = pod["metadata"]["labels"].get("shadowpod.dev/role", "?")
        click.echo(f"# {role}: kubectl logs -n {namespace} {pod['metadata']['name']} -c agent")
    click.echo("# the operator: kubectl logs -n shadowpod-system deploy/shadowpod-operator")


async def _pods_and_namespace(
    plugin: Any, api: Any, namespace: str, session: str
) -> tuple[str, list[dict[str, Any]]]:
    return namespace, await plugin.pods(api, namespace, session)


@kubectl.command()
@click.argument("migration")
@click.option("--disagreements", is_flag=True, help="Only the turns the judge disagreed on.")
@click.option("--json", "as_json", is_flag=True, help="The verdict and every answer, as JSON.")
@click.pass_obj
def diff(target: Any, migration: str, disagreements: bool, as_json: bool) -> None:
    """The answers MIGRATION's upgrade gate compared: the old version's and the new one's,
    side by side, with the judge's score and reason. Exits 1 when the gate failed."""
    from shadowpod.kube import plugin

    body, kept = _run(target, lambda api, ns: plugin.validation_answers(api, ns, migration))
    verdict = (body.get("status") or {}).get("validation")
    if verdict is None or kept is None:
        fail(
            f"AgentMigration {migration!r} compared no answers: it ran no upgrade gate"
            " (spec.validation, or its session's spec.migration.validation on an image"
            " change), or has not reached Validating yet",
            NOT_FOUND,
        )
    if as_json:
        document = {"migration": migration, "validation": verdict, **kept.model_dump(mode="json")}
        click.echo(json.dumps(document, indent=2))
    else:
        _print_answers(migration, verdict, kept, disagreements=disagreements)
    if not verdict.get("passed"):
        sys.exit(NOT_SUCCEEDED)


def _print_answers(name: str, verdict: dict[str, Any], kept: Any, *, disagreements: bool) -> None:
    console = Console()
    outcome = "passed" if verdict.get("passed") else "FAILED"
    console.print(
        f"{name}: {kept.source_image} -> {kept.target_image}: {outcome}"
        + (f" ({verdict['message']})" if verdict.get("message") else ""),
        markup=False,
        highlight=False,
    )
    for found in kept.comparisons:
        what = f"golden session {found.golden}" if found.golden else "live turns"
        if found.golden is None and verdict.get("fromSeq") is not None:
            what += f" after seq {verdict['fromSeq']}"
        console.print(
            f"{what}: {found.agreed}/{found.compared} agree by the {found.judge} judge"
            f" (needs {found.threshold:.0%}): {'passed' if found.passed else 'FAILED'}",
            markup=False,
            highlight=False,
        )
        table = Table(
            "SEQ",
            "",
            "SCORE",
            f"OLD ({kept.source_image})",
            f"NEW ({kept.target_image})",
            "WHY",
            show_lines=True,
        )
        for turn in found.turns:
            if disagreements and turn.agreed:
                continue
            table.add_row(
                str(turn.seq),
                "=" if turn.agreed else "✗",
                f"{turn.score:.2f}",
                Text(turn.old),
                Text(turn.new),
                Text(turn.reason),
            )
        console.print(table)
    if kept.cut:
        console.print(f"({kept.cut} answers were cut short to fit in the ConfigMap)")


@kubectl.group()
def rollout() -> None:
    """An AgentDeployment's rollout: status, pause, resume, abort, history."""


@rollout.command("status")
@click.argument("deployment")
@click.pass_obj
def rollout_status(target: Any, deployment: str) -> None:
    """Where DEPLOYMENT's rollout stands; exit 1 when it halted."""
    from shadowpod.kube import plugin

    body = _run(target, lambda api, ns: plugin.deployment(api, ns, deployment))
    st = body.get("status") or {}
    counts = st.get("sessions") or {}
    gates = st.get("gateVerdicts") or {}
    console = Console()
    target_image = st.get("targetImage") or body["spec"]["template"]["image"]
    console.print(
        f"agentdeployment/{deployment}: {st.get('phase') or 'not observed yet'},"
        f" revision {st.get('revision', 0)}: {st.get('stableImage') or '-'} → {target_image}"
    )
    console.print(
        f"step {st.get('currentStep', 0)} of {max(0, (st.get('steps') or 1) - 1)}:"
        f" {st.get('stepDescription') or '-'}"
    )
    console.print(
        "sessions: "
        + ", ".join(
            f"{counts.get(k, 0)} {k}"
            for k in (
                "total",
                "updated",
                "pinned",
                "queued",
                "migrating",
                "failed",
                "unavailable",
                "suspended",
            )
        )
    )
    versions = Table("IMAGE", "SESSIONS")
    for version in st.get("versions", []):
        versions.add_row(version["image"], str(version["sessions"]))
    console.print(versions)
    console.print(f"gates: {gates.get('passed', 0)} passed, {gates.get('rejected', 0)} rejected")
    for rejection in gates.get("recentRejections", []):
        console.print(f"  {rejection['session']} ({rejection['judge']}): {rejection['message']}")
    if eta := st.get("estimatedCompletionTime"):
        console.print(f"estimated completion: {eta}")
    conditions = Table("CONDITION", "STATUS", "REASON", "MESSAGE")
    for condition in st.get("conditions", []):
        conditions.add_row(
            condition["type"], condition["status"], condition["reason"], condition["message"]
        )
    console.print(conditions)
    if st.get("message"):
        console.print(Text(st["message"]))
    if st.get("phase") == "Halted":
        sys.exit(NOT_SUCCEEDED)


@rollout.command("pause")
@click.argument("deployment")
@click.pass_obj
def rollout_pause(target: Any, deployment: str) -> None:
    """Start no more migrations (running ones finish): spec.paused."""
    from shadowpod.kube import plugin

    _run(target, lambda api, ns: plugin.pause(api, ns, deployment))
    click.echo(f"agentdeployment/{deployment} paused")


@rollout.command("resume")
@click.argument("deployment")
@click.pass_obj
def rollout_resume(target: Any, deployment: str) -> None:
    """Unpause; end a pause step; lift a halt (the step's failure budget starts again)."""
    from shadowpod.kube import plugin

    count = _run(target, lambda api, ns: plugin.resume(api, ns, deployment))
    click.echo(f"agentdeployment/{deployment} resumed (resume {count})")


@rollout.command("abort")
@click.argument("deployment")
@click.pass_obj
def rollout_abort(target: Any, deployment: str) -> None:
    """Move the sessions the current rollout upgraded back to the stable image, live."""
    from shadowpod.kube import plugin

    revision = _run(target, lambda api, ns: plugin.abort(api, ns, deployment))
    click.echo(f"agentdeployment/{deployment} revision {revision} aborted: sessions move back")


@rollout.command("history")
@click.argument("deployment")
@click.pass_obj
def rollout_history(target: Any, deployment: str) -> None:
    """The migrations DEPLOYMENT's rollouts made, oldest first, by revision."""
    from shadowpod.kube import plugin

    found = _run(target, lambda api, ns: plugin.rollout_history(api, ns, deployment))
    table = Table("REVISION", "MIGRATION", "SESSION", "TARGET", "PHASE", "RESULT", "REASON")
    for body in found:
        st = body.get("status") or {}
        failed: dict[str, Any] = next(
            (
                c
                for c in st.get("conditions", [])
                if c["type"] == "Failed" and c["status"] == "True"
            ),
            {},
        )
        table.add_row(
            (body["metadata"].get("labels") or {}).get("shadowpod.dev/rollout-revision", ""),
            body["metadata"]["name"],
            body["spec"]["sessionRef"]["name"],
            body["spec"]["target"].get("image", ""),
            st.get("phase", Phase.QUEUED.value),
            st.get("result") or "",
            failed.get("reason", ""),
        )
    Console().print(table)


def main() -> None:
    kubectl()
