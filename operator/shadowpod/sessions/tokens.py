"""Bearer tokens: generated here, stored only as hashes, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Final

AGENT_TOKEN_META: Final = "agent_token_sha256"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(presented: str, expected_hash: str) -> bool:
    """Constant-time: the comparison takes as long whatever the presented token is."""
    return hmac.compare_digest(token_hash(presented), expected_hash)


def any_token_matches(presented: str, expected_hashes: frozenset[str]) -> bool:
    presented_hash = token_hash(presented)
    # Compare against every hash, without stopping early, so timing tells nothing.
    return sum(hmac.compare_digest(presented_hash, h) for h in expected_hashes) > 0
