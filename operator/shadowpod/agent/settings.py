"""How an agent process is told how to run: environment variables.

- ``SHADOWPOD_IDENTITY_DIR``: directory with the identity files (required);
- ``SHADOWPOD_MODE``: ``owner`` (serve at ``SHADOWPOD_EPOCH``) or ``shadow`` (catch
  up, then wait to be named owner);
- ``SHADOWPOD_EPOCH``: the owner epoch, in owner mode;
- ``SHADOWPOD_SNAPSHOT``: in shadow mode, the snapshot watermark to restore from
  (default: the latest);
- ``SHADOWPOD_LISTEN``: ``host:port`` of the status endpoints (``0.0.0.0:8080``);
- ``SHADOWPOD_SNAPSHOT_EVERY``: owner: snapshot every N journal entries (10000; 0 =
  never);
- ``SHADOWPOD_DRAIN_GRACE_S``: seconds between SIGTERM and SIGKILL for background
  processes (5);
- ``SHADOWPOD_MAX_APPEND_BYTES``, ``SHADOWPOD_MAX_APPEND_ENTRIES``: the gateway's
  limits on one append (its ``--max-body-bytes``, 1 MiB, and 1000 entries): an
  owner's writes are cut to fit them, and narrowed further when the gateway's 413
  names a smaller one;
- ``SHADOWPOD_PROCESS_INVENTORY``: a file where the background processes are listed
  as they start and end (for whoever cleans up after this process, should it die);
- ``SHADOWPOD_DESCRIBE=1``: print what the agent's code declares (name, version,
  ``state_schema``, ``reads_state_schemas``) as one JSON line and exit 0 — how whoever
  runs an image learns its schema versions from the code itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from shadowpod.agent.appends import SMALLEST_BODY

DESCRIBE_ENV: Final = "SHADOWPOD_DESCRIBE"


class AgentSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    identity_dir: Path
    mode: Literal["owner", "shadow"] = "owner"
    epoch: int | None = Field(default=None, ge=1)
    snapshot: int | None = Field(default=None, ge=0)
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535)
    snapshot_every: int = Field(default=10_000, ge=0)
    drain_grace_s: float = Field(default=5.0, ge=0)
    max_append_bytes: int = Field(default=1024 * 1024, ge=SMALLEST_BODY)
    max_append_entries: int = Field(default=1000, ge=1)
    process_inventory: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentSettings:
        env = os.environ if env is None else env
        if not any(name.startswith("SHADOWPOD_") for name in env):
            # Run by hand (python agent.py): nothing of what Shadowpod gives an agent.
            raise ValueError(
                "this is a Shadowpod agent: Shadowpod starts it, with the session, gateway "
                "and identity in its environment (SHADOWPOD_*). Run it with `shadowpod up "
                "--images MAP --image NAME` or `shadowpod demo --images MAP --from A --to B` "
                "(MAP names this file's command; docs/local-runtime.md), or in a pod the "
                "operator creates"
            )
        if "SHADOWPOD_IDENTITY_DIR" not in env:
            raise ValueError(
                "SHADOWPOD_IDENTITY_DIR is not set: point it at the agent's identity files"
            )
        host, _, port = env.get("SHADOWPOD_LISTEN", "0.0.0.0:8080").rpartition(":")
        values: dict[str, object] = {
            "identity_dir": env["SHADOWPOD_IDENTITY_DIR"],
            "mode": env.get("SHADOWPOD_MODE", "owner"),
            "host": host,
            "port": port,
        }
        for key, field in (
            ("SHADOWPOD_EPOCH", "epoch"),
            ("SHADOWPOD_SNAPSHOT", "snapshot"),
            ("SHADOWPOD_SNAPSHOT_EVERY", "snapshot_every"),
            ("SHADOWPOD_DRAIN_GRACE_S", "drain_grace_s"),
            ("SHADOWPOD_MAX_APPEND_BYTES", "max_append_bytes"),
            ("SHADOWPOD_MAX_APPEND_ENTRIES", "max_append_entries"),
            ("SHADOWPOD_PROCESS_INVENTORY", "process_inventory"),
        ):
            if key in env:
                values[field] = env[key]
        settings = cls.model_validate(values)
        if settings.mode == "owner" and settings.epoch is None:
            raise ValueError(
                "SHADOWPOD_MODE=owner needs SHADOWPOD_EPOCH: the epoch this owner was given"
            )
        return settings
