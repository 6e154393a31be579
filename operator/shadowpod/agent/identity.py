"""Who this agent instance is, read from files every time it (re)connects.

A process restored from a CRIU checkpoint keeps the environment and memory of the
process it was checkpointed from; files mounted into the new pod (Secret, downward
API) are what tell it who it is now. So identity is re-read from ``identity_dir`` on
every reconnect, never only remembered.

Files: ``session``, ``instance``, ``gateway`` (base URL) and ``token`` (the
session's agent token); optionally ``environment.json``, a JSON object of the
environment variables of the place this instance is in (its listen address, its
process inventory), which a process restored into that place applies — its own
environment is the one it was checkpointed with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENVIRONMENT_FILE = "environment.json"


@dataclass(frozen=True)
class Identity:
    session: str
    instance: str
    gateway: str
    token: str

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
        return cls(**values)

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
        environment: Mapping[str, str] | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        files = [("session", session), ("instance", instance), ("gateway", gateway)]
        files.append(("token", token))
        if environment is not None:
            files.append((ENVIRONMENT_FILE, json.dumps(dict(environment))))
        for name, value in files:
            target = directory / name
            temporary = directory / f".{name}.tmp"
            temporary.write_text(value + "\n")
            temporary.chmod(0o600)
            temporary.replace(target)
