"""What a new owner journals when it adopts a session (DESIGN §4.6).

- A tool call whose intent is journaled but whose result is not may or may not have
  had its side effect. Unless the tool is declared idempotent it is not repeated: an
  ``abandoned`` result records that decision, and the turn that asks for it learns
  so (``ToolAbandoned``).
- Agent state written under an older schema is migrated to this agent's schema, as
  one ``state`` entry that replaces the values.
"""

from __future__ import annotations

from shadowpod.agent.appends import fitting_id
from shadowpod.agent.declaration import AgentDeclaration
from shadowpod.domain.entries import NewEntry
from shadowpod.domain.payloads import StatePayload, ToolResultPayload, ToolStatus
from shadowpod.domain.state import SessionState


def adoption_entries(agent: AgentDeclaration, state: SessionState, epoch: int) -> list[NewEntry]:
    """The entries that adopt ``state`` at ``epoch``; ids are derived from what they
    decide, so adopting twice (a retried append) journals them once."""
    entries: list[NewEntry] = []
    for call in state.tools.uncertain():
        spec = agent.tools.get(call.tool)
        if spec is None or not spec.idempotent:
            entries.append(
                NewEntry.of(
                    ToolResultPayload(
                        call_id=call.call_id,
                        status=ToolStatus.ABANDONED,
                        error=f"outcome unknown after the owner changed to epoch {epoch}; "
                        "not repeated",
                        turn=call.turn,
                    ),
                    id=fitting_id(f"tool-result:{call.call_id}"),
                )
            )
    if state.agent.values and state.agent.schema_version != agent.state_schema:
        migrated = agent.migrate_state(dict(state.agent.values), state.agent.schema_version)
        entries.append(
            NewEntry.of(
                StatePayload(values=migrated, replace=True, schema_version=agent.state_schema),
                id=f"state-migration:{epoch}",
            )
        )
    return entries
