"""The agent a live scenario runs: any agent, not only the reference one.

What the demo and ``bench migrate`` need to know of an agent: its images (a map),
which one the session starts on and which it moves to, what the client says (an
opening, then a message generator), and what proves the memory survived the move (a
text every reply from a later version must carry).

What a reply must carry for the client-side checks: ``meta.version`` (any string
that changes with the version that answered: the checks count replies by it and see
one switch per owner change). A reply without it is counted as version ``?``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shadowpod.local.images import ImageMap, reference_images

MessageGenerator = Callable[[int], str]


def numbered(template: str = "message {n}") -> MessageGenerator:
    """Message ``n`` of the load: ``template`` with ``{n}`` filled in."""
    if "{n}" not in template:
        raise ValueError(f"a message template must hold {{n}} (the message number): {template!r}")
    return lambda n: template.replace("{n}", str(n))


@dataclass(frozen=True)
class AgentUnderTest:
    images: ImageMap
    source: str  # the image the session starts on
    target: str  # the image it is moved to
    # Moves after the first go between ``target`` and this (another tag of it: a
    # relocation, not an upgrade); ``target`` again when not given.
    relocate: str | None = None
    # Said (and answered) before the load starts: what the agent must remember.
    seed: Sequence[str] = ()
    message: MessageGenerator = field(default_factory=numbered)
    # Every reply from a later version than the first must contain this (the memory
    # check); ``None``: not checked.
    remembers: str | None = None

    def __post_init__(self) -> None:
        for image in (self.source, self.target, self.relocate):
            if image is not None:
                self.images.resolve(image)  # ImageNotFound names the known ones

    def move_target(self, moves: int) -> str:
        """The image of a session's move number ``moves`` (from 0)."""
        if moves == 0 or self.relocate is None:
            return self.target
        return self.relocate if moves % 2 else self.target

    @classmethod
    def from_map(
        cls,
        path: Path,
        *,
        source: str,
        target: str,
        relocate: str | None = None,
        seed: Sequence[str] = (),
        message: str = "message {n}",
        remembers: str | None = None,
    ) -> AgentUnderTest:
        """From the CLI's ``--images map.yaml --from A --to B``; ``ValueError`` (or
        ``ImageNotFound``) saying what is wrong."""
        return cls(
            images=ImageMap.load(path),
            source=source,
            target=target,
            relocate=relocate,
            seed=tuple(seed),
            message=numbered(message),
            remembers=remembers,
        )


REFERENCE_NAME = "Ada"


def reference_agent(heartbeat_s: float = 0.0) -> AgentUnderTest:
    """The reference agent (``examples/01-reference-agent``): v1 learns a name, v2 and
    its other tag must greet it."""
    return AgentUnderTest(
        images=reference_images(heartbeat_s),
        source="refagent:v1",
        target="refagent:v2",
        relocate="refagent:v2-b",
        seed=(f"my name is {REFERENCE_NAME}",),
        remembers=f"hi {REFERENCE_NAME}",
    )
