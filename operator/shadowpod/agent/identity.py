"""Who this agent instance is, read from files every time it (re)connects.

A process restored from a CRIU checkpoint keeps the environment and memory of the
process it was checkpointed from; files mounted into the new pod (Secret, downward
API) are what tell it who it is now. So identity is re-read from ``identity_dir`` on
every reconnect, never only remembered.

Files: ``session``, ``instance``, ``gateway`` (base URL) and ``token`` (the
session's agent token).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
    def write(directory: Path, *, session: str, instance: str, gateway: str, token: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in (
            ("session", session),
            ("instance", instance),
            ("gateway", gateway),
            ("token", token),
        ):
            target = directory / name
            temporary = directory / f".{name}.tmp"
            temporary.write_text(value + "\n")
            temporary.chmod(0o600)
            temporary.replace(target)
