"""Forking a LangGraph thread where LangGraph forks it: at a checkpoint.

A Shadowpod fork at seq N carries the session's state at N, and the saver keeps its
checkpoints in that state: the fork's saver serves every checkpoint the parent had at
N, under the same ids. So a fork at checkpoint C is a Shadowpod fork at the seq of the
``state`` entry that journaled C; on the fork, LangGraph's own fork from C (a run with
``checkpoint_id`` C in its config, or ``update_state`` on it) goes on live, in a
session of its own that migrates like any other.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import EntryKind


def checkpoint_seq(entries: Iterable[JournalEntry], checkpoint_id: str) -> int | None:
    """The seq of the entry that journaled checkpoint ``checkpoint_id`` (the first to
    name it: a checkpoint's header is written before anything refers to it), or None.
    Ids are LangGraph's uuid6, so a match is that checkpoint's."""
    wanted = orjson.dumps(checkpoint_id)
    for entry in entries:
        if entry.kind == EntryKind.STATE and wanted in orjson.dumps(entry.payload):
            return entry.seq
    return None
