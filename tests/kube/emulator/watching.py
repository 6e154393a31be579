"""The watch cache: every change, numbered by resourceVersion, kept for a window (as
etcd's history is), and the watchers it is fanned out to.

A watch that starts from a resourceVersion gets every change after it, and nothing
before; one that starts from a version older than the window gets the ``410 Gone``
error event a real server sends, after which a client lists again. A change that
moves an object into or out of a watcher's selector reaches it as ``ADDED`` or
``DELETED``, as on a real server.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kmock

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Change:
    rv: int
    resource: kmock.resource
    type: str  # ADDED, MODIFIED, DELETED
    new: Obj  # the object after the change (its last state, for DELETED)
    old: Obj | None


@dataclass(eq=False)
class Watcher:
    resource: kmock.resource
    matches: Callable[[Obj], bool]
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)

    def events(self, change: Change) -> list[dict[str, Any]]:
        if change.resource != self.resource:
            return []
        now = self.matches(change.new)
        before = change.old is not None and self.matches(change.old)
        if change.type == "DELETED":
            return [{"type": "DELETED", "object": change.new}] if now or before else []
        if now:
            return [{"type": "MODIFIED" if before else "ADDED", "object": change.new}]
        if before:
            return [{"type": "DELETED", "object": change.new}]
        return []


class WatchCache:
    def __init__(self, size: int) -> None:
        self._changes: collections.deque[Change] = collections.deque(maxlen=size)
        self._watchers: set[Watcher] = set()
        self.compacted = 0  # the newest resourceVersion no longer in the window

    def publish(self, change: Change) -> None:
        if len(self._changes) == self._changes.maxlen:
            self.compacted = self._changes[0].rv
        self._changes.append(change)
        for watcher in self._watchers:
            for event in watcher.events(change):
                watcher.queue.put_nowait(event)

    def subscribe(self, watcher: Watcher, since: int | None) -> list[dict[str, Any]]:
        """Register ``watcher``; return the changes after ``since`` it has missed.

        Synchronous on purpose: nothing can be published between the replay and the
        registration, so no change is lost or seen twice.
        """
        missed: list[dict[str, Any]] = []
        if since is not None:
            for change in self._changes:
                if change.rv > since:
                    missed.extend(watcher.events(change))
        self._watchers.add(watcher)
        return missed

    def unsubscribe(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def too_old(self, since: int) -> bool:
        return since < self.compacted

    @property
    def watchers(self) -> int:
        return len(self._watchers)
