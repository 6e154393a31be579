"""Bearer tokens: generated here, stored only as hashes, compared in constant time."""

from __future__ import annotations

import base64
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


# The session's owner key (hex), kept in the session record beside the agent token's
# hash; it never leaves the gateway. An instance's owner credential is derived from it
# (``owner_credential``), minted for whoever starts the instance (the control token).
OWNER_KEY_META: Final = "owner_key"
# The headers an owner presents its credential in, beside the agent token.
INSTANCE_HEADER: Final = "Shadowpod-Instance"
OWNER_CREDENTIAL_HEADER: Final = "Shadowpod-Owner-Credential"


def new_owner_key() -> str:
    return secrets.token_hex(32)


def owner_credential(owner_key: str, session: str, instance: str) -> str:
    """What instance ``instance`` presents to write as owner of ``session``: a MAC of
    the two under the session's owner key. The ownership record names the owner of
    each epoch, so a credential opens writes only at the epochs its instance was named
    owner at: an owner told by a 409 that the epoch moved on cannot write at it."""
    message = f"shadowpod-owner\x00{session}\x00{instance}".encode()
    digest = hmac.new(bytes.fromhex(owner_key), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def owner_credential_matches(owner_key: str, session: str, instance: str, presented: str) -> bool:
    return hmac.compare_digest(owner_credential(owner_key, session, instance), presented)
