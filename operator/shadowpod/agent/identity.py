"""Who this agent instance is, read from files every time it (re)connects.

A process restored from a CRIU checkpoint keeps the environment and memory of the
process it was checkpointed from; files mounted into the new pod (Secret, downward
API) are what tell it who it is now. So identity is re-read from ``identity_dir`` on
every reconnect, never only remembered.

Files: ``session``, ``instance``, ``gateway`` (base URL) and ``token`` (the
session's agent token); ``owner-credential``, this instance's owner credential (what
lets it write as owner at the epochs it is named owner at; minted by whoever started
it); optionally ``agent-name`` and ``agent-principles`` (a JSON
list of strings: the session's identity, ``AgentSession.spec.identity``, which the
persona check's re-anchor hook receives), and ``environment.json``, a JSON object of the
environment variables of the place this instance is in (its listen address, its
process inventory), which a process restored into that place applies — its own
environment is the one it was checkpointed with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ENVIRONMENT_FILE = "environment.json"
AGENT_NAME_FILE = "agent-name"
PRINCIPLES_FILE = "agent-principles"
OWNER_CREDENTIAL_FILE = "owner-credential"


@dataclass(frozen=True)
class SessionIdentity:
    """Who the session's agent is: its name and the principles it keeps, as the
    session's spec says (``None`` and ``[]`` where it says nothing)."""

    session: str
    name: str | None = None
    principles: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, directory: Path, session: str) -> SessionIdentity:
        try:
            name: str | None = (directory / AGENT_NAME_FILE).read_text().strip() or None
        except FileNotFoundError:
            name = None
        try:
            principles = json.loads((directory / PRINCIPLES_FILE).read_text() or "[]")
        except FileNotFoundError:
            principles = []
        except ValueError as exc:
            raise ValueError(f"{directory / PRINCIPLES_FILE} is not JSON: {exc}") from None
        if not isinstance(principles, list) or not all(isinstance(p, str) for p in principles):
            raise ValueError(f"{directory / PRINCIPLES_FILE} must be a JSON list of strings")
        return cls(session=session, name=name, principles=principles)


@dataclass(frozen=True)
class Identity:
    session: str
    instance: str
    gateway: str
    token: str
    owner_credential: str | None = None

    @property
    def owner(self) -> tuple[str, str] | None:
        """What the instance presents on owner routes, if it was given a credential."""
        if self.owner_credential is None:
            return None
        return self.instance, self.owner_credential

    @classmethod
    def load(cls, directory: Path) -> Identity:
        values = {}
        for name in ("session", "instance", "gateway", "token"):
            path = directory / name
            try:
                values[name] = path.read_text().strip()
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"identity file {path} is missing: the agent needs session, instance, "
                    f"gateway and token files in {directory}"
                ) from None
            if not values[name]:
                raise ValueError(f"identity file {path} is empty")
        try:
            credential = (directory / OWNER_CREDENTIAL_FILE).read_text().strip() or None
        except FileNotFoundError:
            credential = None
        return cls(**values, owner_credential=credential)

    @staticmethod
    def environment(directory: Path) -> dict[str, str]:
        """The place's environment (``environment.json``); empty when there is none."""
        path = directory / ENVIRONMENT_FILE
        try:
            values = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise ValueError(f"{path} is not JSON: {exc}") from None
        if not isinstance(values, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()
        ):
            raise ValueError(f"{path} must be a JSON object of strings (variable: value)")
        return values

    @staticmethod
    def write(
        directory: Path,
        *,
        session: str,
        instance: str,
        gateway: str,
        token: str,
        owner_credential: str | None = None,
        environment: Mapping[str, str] | None = None,
        agent_name: str | None = None,
        principles: Sequence[str] | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        files = [("session", session), ("instance", instance), ("gateway", gateway)]
        files.append(("token", token))
        if owner_credential is not None:
            files.append((OWNER_CREDENTIAL_FILE, owner_credential))
        if agent_name is not None:
            files.append((AGENT_NAME_FILE, agent_name))
        if principles is not None:
            files.append((PRINCIPLES_FILE, json.dumps(list(principles))))
        if environment is not None:
            files.append((ENVIRONMENT_FILE, json.dumps(dict(environment))))
        for name, value in files:
            target = directory / name
            temporary = directory / f".{name}.tmp"
            temporary.write_text(value + "\n")
            temporary.chmod(0o600)
            temporary.replace(target)
