"""``--images map.yaml --from A --to B``: the agent a demo or a benchmark runs.

Without ``--images`` it is the reference agent. With it, any agent whose image map
(see docs/local-runtime.md) names ``--from`` (the image the session starts on) and
``--to`` (the image it moves to); ``--message`` is the load's message template,
``--seed`` the opening messages (said before the load), ``--remembers`` the text
every reply from the new version must carry (the memory check). Replies must carry
``meta.version`` for the client-side checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from shadowpod.cli.errors import fail
from shadowpod.engine.ports import ImageNotFound
from shadowpod.local.subject import AgentUnderTest, numbered, reference_agent

F = TypeVar("F", bound=Callable[..., Any])


def agent_options(fn: F) -> F:
    options = [
        click.option(
            "--images",
            "images_path",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help="An image map (YAML) of the agent to run; default: the reference agent.",
        ),
        click.option("--from", "source", help="Image the session starts on (in --images)."),
        click.option("--to", "target", help="Image it is moved to (in --images)."),
        click.option(
            "--relocate",
            help="Another tag of --to: later moves go between the two (bench migrate).",
        ),
        click.option(
            "--message",
            default="message {n}",
            show_default=True,
            help="The load's messages; {n} is the message number.",
        ),
        click.option(
            "--seed",
            multiple=True,
            help="An opening message, said and answered before the load (repeatable).",
        ),
        click.option(
            "--remembers",
            help="Text every reply from a later version must carry (the memory check).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def agent_under_test(
    images_path: Path | None,
    source: str | None,
    target: str | None,
    relocate: str | None,
    message: str,
    seed: Sequence[str],
    remembers: str | None,
    heartbeat_s: float = 0.0,
) -> AgentUnderTest:
    """The agent the options name; exits 2 with what is wrong."""
    try:
        if images_path is None:
            if source or target or relocate:
                fail("--from, --to and --relocate name images of a map: give --images too", 2)
            agent = reference_agent(heartbeat_s)
            if seed or remembers is not None:
                agent = dataclasses.replace(agent, seed=tuple(seed), remembers=remembers)
            return dataclasses.replace(agent, message=numbered(message))
        if not source or not target:
            fail("--images needs --from (the image to start) and --to (the image to move to)", 2)
        return AgentUnderTest.from_map(
            images_path,
            source=source,
            target=target,
            relocate=relocate,
            seed=seed,
            message=message,
            remembers=remembers,
        )
    except (ValueError, ImageNotFound) as exc:
        fail(str(exc), 2)
