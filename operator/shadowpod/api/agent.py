"""What an agent instance says about itself on its own HTTP endpoint (``/v1/status``).

Served by the agent runtime (``shadowpod.agent.server``), read by whoever runs the
instance: the local runtime, the operator's pod runtime, a person with curl. Readers
ignore fields they do not know, so an agent newer than its reader still reports.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shadowpod.api.models import ProcessReport

AgentMode = Literal["starting", "shadow", "owner", "draining", "stopped", "failed"]


class _Reported(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class CatchUpReport(_Reported):
    entries: int
    seconds: float
    entries_per_s: float


class PromotionReport(_Reported):
    epoch: int
    fence_seq: int
    at: float = Field(description="Unix time the epoch marker naming this instance was applied.")
    first_turn: int | None = Field(default=None, description="The first turn it took as owner.")
    first_turn_at: float | None = Field(default=None, description="Unix time that turn started.")


class BackgroundProcess(_Reported):
    name: str
    pid: int
    running: bool


class AgentStatus(_Reported):
    agent: str
    version: str
    state_schema: int = Field(description="The agent state schema this agent writes.")
    reads_state_schemas: list[int] = Field(description="Every schema it can read (migrate from).")
    session: str
    instance: str
    mode: AgentMode
    ready: bool
    serving: bool = Field(
        description="Owner at ``epoch``, with its adoption of the session journaled there."
    )
    epoch: int
    watermark: int
    pending: int
    turns: int
    warmed: int = Field(
        default=0,
        description="The watermark a shadow's on_shadow_ready hook last ran at (0: never).",
    )
    processes: list[BackgroundProcess] = Field(default_factory=list)
    catchup: CatchUpReport | None = None
    promotion: PromotionReport | None = None
    drained: list[ProcessReport] | None = None
    error: str | None = None


class CheckpointRequest(BaseModel):
    """``POST /v1/checkpoint``: fork a stopped copy of the owner for CRIU to dump."""

    model_config = ConfigDict(extra="forbid")

    output: str | None = Field(
        default=None,
        description="Where the restored copy's stdout and stderr go (default /dev/null).",
    )
    wait_s: float = Field(
        default=5.0, ge=0, le=300, description="How long to wait for a turn to end."
    )


class CheckpointReport(_Reported):
    """The copy: its pid (for ``criu dump -t``), and the state it holds."""

    pid: int
    watermark: int
    epoch: int
    instance: str
