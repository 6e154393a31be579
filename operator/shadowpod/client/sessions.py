"""Starting a session in the gateway: it is created, then given its first owner.

What every runtime does before it starts a session's first instance (the local
deployment, the operator): the owner is recorded at epoch 1 before its instance
exists, so the instance's first write is already fenced against anyone else.
"""

from __future__ import annotations

from shadowpod.api.models import CreateSession, OwnershipChange, SessionCreated
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.ownership import Ownership

FIRST_EPOCH = 1


async def start_session(
    admin: GatewayClient, request: CreateSession, *, owner: str
) -> tuple[SessionCreated, Ownership]:
    """Create ``request.session`` and make ``owner`` its owner at epoch 1 — or, for a
    fork (which starts at its parent's epoch, with no owner), at the epoch after."""
    created = await admin.create_session(request)
    start = 0 if request.fork_from is None else (await admin.ownership(request.session)).epoch
    ownership = await admin.set_ownership(
        request.session,
        OwnershipChange(expect_epoch=start, epoch=start + FIRST_EPOCH, owner=owner),
    )
    return created, ownership
