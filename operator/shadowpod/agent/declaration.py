"""What an agent author declares — handlers, tools, state schema migrations — and
what the runtime asks of it. ``shadowpod.agent.app.Agent`` adds ``run()``.

agent = Agent("support-bot", version="2", state_schema=2)

@agent.on_message
async def answer(turn: Turn) -> None:
    await turn.reply(f"you said {turn.content}")

@agent.migration(from_version=1)
def split_profile(values: dict[str, JsonValue]) -> dict[str, JsonValue]:
    return {"profile": {"name": values.get("name")}}

if __name__ == "__main__":
    agent.run()
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import JsonValue

from shadowpod.agent.tools import ToolFn, ToolSpec
from shadowpod.domain.errors import SchemaTooNew
from shadowpod.gates.normalise import compile_patterns

if TYPE_CHECKING:
    from shadowpod.agent.identity import SessionIdentity
    from shadowpod.agent.turn import OwnerContext, Turn

TurnHandler = Callable[["Turn"], Awaitable[None]]
OwnerHook = Callable[["OwnerContext"], Awaitable[None]]
ReanchorHook = Callable[["SessionIdentity"], Awaitable[None]]
# A shadow's agent values, read-only: what the owner's first turn will see.
ShadowReadyHook = Callable[[Mapping[str, Any]], None]
StartHook = Callable[[], Awaitable[None]]
StateMigration = Callable[[dict[str, JsonValue]], dict[str, JsonValue]]
F = TypeVar("F", bound=Callable[..., Any])


class AgentDeclaration:
    def __init__(self, name: str, *, version: str, state_schema: int = 1) -> None:
        if state_schema < 1:
            raise ValueError("state_schema starts at 1")
        self.name = name
        self.version = version
        self.state_schema = state_schema
        self.message_handler: TurnHandler | None = None
        self.owner_hook: OwnerHook | None = None
        self.reanchor_hook: ReanchorHook | None = None
        self.shadow_ready_hook: ShadowReadyHook | None = None
        self.start_hook: StartHook | None = None
        self.tools: dict[str, ToolSpec] = {}
        self.migrations: dict[int, StateMigration] = {}
        self.nondeterministic_patterns: list[str] = []

    # --- declarations -----------------------------------------------------------------

    def on_message(self, fn: TurnHandler) -> TurnHandler:
        """Handle one inbound entry (a user message or a schedule fire): one turn."""
        self.message_handler = fn
        return fn

    def on_owner(self, fn: OwnerHook) -> OwnerHook:
        """Called when this instance becomes the owner: first start, recovery or promotion."""
        self.owner_hook = fn
        return fn

    def on_reanchor(self, fn: ReanchorHook) -> ReanchorHook:
        """Called when a persona check found this version drifting from the session's
        identity and the policy says ``reanchor``: re-read who the agent is (its name,
        its principles) and act as it. The persona is probed again after it."""
        self.reanchor_hook = fn
        return fn

    def on_start(self, fn: StartHook) -> StartHook:
        """Called once as the process starts, before it serves or waits for anything:
        a warm spare runs it before it is handed a session, so its cost is paid before
        a migration needs the process. To warm what a process's first turn would
        otherwise warm — in the fence pause, when that first turn is a new owner's:
        lazy imports, caches, a framework's first run on throwaway input
        (``ShadowpodSaver.prime``). It gets no session and no turn: it must not call a
        model or a tool, nor change anything outside the process. Its errors are
        logged, never fatal."""
        self.start_hook = fn
        return fn

    def on_shadow_ready(self, fn: ShadowReadyHook) -> ShadowReadyHook:
        """Called in a shadow with the agent's values once it has caught up, then
        again after each batch of the journal it follows, until it is promoted: to
        warm what the first owner turn would otherwise build (a decoded conversation)
        while the source still serves, not in the fence pause. It gets no turn, so
        it cannot journal anything; it must not change the values, and should cost
        only what changed since its last call. Its errors are logged, never fatal."""
        self.shadow_ready_hook = fn
        return fn

    def tool(
        self, name: str | None = None, *, idempotent: bool = False
    ) -> Callable[[ToolFn], ToolFn]:
        """Register a tool. ``idempotent`` tools may be repeated when their outcome is unknown."""

        def register(fn: ToolFn) -> ToolFn:
            tool_name = name or fn.__name__
            self.tools[tool_name] = ToolSpec(tool_name, fn, idempotent)
            return fn

        return register

    def nondeterministic(self, *patterns: str) -> None:
        """Regular expressions for what differs between two runs of the same turn (a
        timestamp, an order id): upgrade gates' judges mask them before comparing."""
        compile_patterns(patterns)  # a bad one fails at import, not at the gate
        self.nondeterministic_patterns.extend(patterns)

    def migration(self, *, from_version: int) -> Callable[[StateMigration], StateMigration]:
        """Register the step that turns the agent's state from ``from_version`` to the next."""

        def register(fn: StateMigration) -> StateMigration:
            if not 1 <= from_version < self.state_schema:
                raise ValueError(
                    f"a migration from v{from_version} makes no sense for state schema "
                    f"v{self.state_schema}"
                )
            self.migrations[from_version] = fn
            return fn

        return register

    # --- what the runtime asks --------------------------------------------------------

    @property
    def reads_state_schemas(self) -> list[int]:
        """Every agent state schema version this agent can read (migrate from)."""
        readable = [self.state_schema]
        version = self.state_schema - 1
        while version >= 1 and version in self.migrations:
            readable.append(version)
            version -= 1
        return sorted(readable)

    def migrate_state(self, values: dict[str, JsonValue], version: int) -> dict[str, JsonValue]:
        """``values`` of schema ``version`` brought to this agent's schema."""
        if version > self.state_schema:
            raise SchemaTooNew(
                found=version, supported=self.state_schema, what=f"{self.name} state"
            )
        if version not in self.reads_state_schemas:
            raise ValueError(
                f"{self.name} v{self.version} cannot read its state schema v{version}: "
                f"it reads {self.reads_state_schemas}"
            )
        for step in range(version, self.state_schema):
            values = self.migrations[step](dict(values))
        return values
