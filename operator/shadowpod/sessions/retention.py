"""A session's retention policy, kept in its meta and enforced by the gateway.

``keep_snapshots``: the newest N snapshots stay, and the journal behind the oldest of
them is truncated (never past the last acked turn, nor what a fork still reads: the
store's ``apply_retention``). The gateway applies it when the policy is set and after
every snapshot an owner stores, so a session's journal is bounded by its snapshot
interval times N, not by its age.
"""

from __future__ import annotations

from typing import Final

from shadowpod.journal.store import JournalStore, Retention

KEEP_SNAPSHOTS_META: Final = "shadowpod.dev/keep-snapshots"


async def set_policy(store: JournalStore, session: str, keep_snapshots: int) -> Retention:
    """Record the policy on the session and apply it now."""
    await store.update_meta(session, {KEEP_SNAPSHOTS_META: str(keep_snapshots)})
    return await store.apply_retention(session, keep_snapshots=keep_snapshots)


async def enforce(store: JournalStore, session: str) -> Retention | None:
    """Apply the session's policy (None: it has none)."""
    keep = (await store.get_session(session)).meta.get(KEEP_SNAPSHOTS_META)
    if keep is None or not keep.isdigit() or int(keep) < 1:
        return None
    return await store.apply_retention(session, keep_snapshots=int(keep))


def own_entries(head: int, truncated_through: int, fork_seq: int | None) -> int:
    """The entries a session's own journal holds: a fork's first ``fork_seq`` are its
    parent's (shared, counted there)."""
    return max(0, head - max(truncated_through, fork_seq or 0))
