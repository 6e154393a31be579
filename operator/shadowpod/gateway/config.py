"""Gateway settings."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from shadowpod.sessions.tokens import token_hash

DEFAULT_MAX_BODY: Final = 1024 * 1024
DEFAULT_MAX_SNAPSHOT: Final = 256 * 1024 * 1024


class GatewayConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    journal_url: str
    host: str = "127.0.0.1"
    port: int = Field(default=8800, ge=0, le=65535)
    control_token_hashes: frozenset[str]
    client_token_hashes: frozenset[str] = frozenset()
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY, ge=1024)
    max_snapshot_bytes: int = Field(
        default=DEFAULT_MAX_SNAPSHOT,
        ge=1024,
        description="Snapshots carry a whole session state: they get a larger limit.",
    )
    max_entries_per_append: int = Field(default=1000, ge=1)
    max_page: int = Field(default=10_000, ge=1, description="Most entries per JSON page.")
    max_wait_s: float = Field(default=30.0, gt=0, description="Longest long-poll.")
    schedules: bool = Field(default=True, description="Fire the sessions' schedules.")
    max_connections_per_peer: int = Field(
        default=256,
        ge=0,
        description="Most connections one client address holds at once (0: no limit). "
        "Behind a proxy every client has the proxy's address: raise it there.",
    )
    header_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A request's headers must arrive within this of the connection "
        "opening or of the previous answer; also the longest a connection stays idle.",
    )
    body_timeout_s: float = Field(
        default=300.0, gt=0, le=3600, description="Longest a request body may take to arrive."
    )
    body_idle_timeout_s: float = Field(
        default=15.0, gt=0, le=3600, description="Longest pause while a body is sent."
    )
    max_streams: int = Field(
        default=1000,
        ge=1,
        description="Event streams (SSE, client and shadow) open at once on this gateway; "
        "one more is 503 TooManyStreams.",
    )
    max_streams_per_session: int = Field(
        default=64,
        ge=1,
        description="Event streams open at once on one session; one more is 503 TooManyStreams.",
    )
    advertise_url: str | None = Field(
        default=None,
        description="Where the other gateway replicas reach this one (http://POD_IP:PORT). "
        "Set, on PostgreSQL: sessions are placed by lease and a request for a session "
        "another replica serves is forwarded there (gateway/placement.py).",
    )
    replica_id: str | None = Field(
        default=None, description="This replica's name in the leases (default: the URL)."
    )
    lease_ttl_s: float = Field(
        default=10.0,
        ge=1.0,
        le=300.0,
        description="A session lease outlives its holder's last renewal by this: the "
        "bound on a dead replica's sessions being served again.",
    )
    delivery_window: int = Field(
        default=4,
        ge=1,
        description="Inbound entries released to an owner ahead of its acks; "
        "a fence waits for at most these.",
    )


def read_tokens(path: Path) -> frozenset[str]:
    """Hashes of the tokens in ``path``: one per line, blank lines and ``#`` comments ignored."""
    lines = path.read_text().splitlines()
    tokens = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    if not tokens:
        raise ValueError(f"{path} holds no token: write one token per line")
    return frozenset(token_hash(token) for token in tokens)
