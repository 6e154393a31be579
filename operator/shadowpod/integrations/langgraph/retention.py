"""Which checkpoints a ``ShadowpodSaver`` keeps, and pruning the others.

LangGraph's savers keep every checkpoint. In the agent's state that is a header, a
set of channel versions and the pending writes per checkpoint, a few KB each, for
ever — and every snapshot carries them. With ``keep=N`` a thread (each namespace of
it) keeps:

- its ``N`` newest checkpoints (ids sort in the order they were made): what
  ``get_state_history`` lists and time travel can start from;
- the head of every branch (a checkpoint no other names as parent): the latest, an
  interrupt waiting for its answer (it is the head of its branch), and the state
  a fork left behind, which a run may go back to.

A pruned checkpoint's header and pending writes are deleted; so are the channel
versions no kept checkpoint holds, and the logs of a list channel that no kept
version reads are emptied (kept in place: versions name logs by number). The
conversation the kept checkpoints hold is not pruned: it is the state.

Pruning happens inside ``put`` once ``N`` is exceeded by a slack (an eighth of ``N``,
at least 8), down to ``N``: its cost is spread over the puts in between. The deletes
are journaled with the turn like every other change, and a snapshot carries only
what is kept, so the journal before it can be truncated by the journal's retention.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, Final

BUCKETS: Final = 64
StatePath = list[str | int]


def bucket(key: str) -> str:
    """The bucket of a checkpoint id or a channel version (stable across processes)."""
    return str(zlib.crc32(key.encode()) % BUCKETS)


def slack(keep: int) -> int:
    return max(8, keep // 8)


class Pruning:
    """The state changes that prune one thread namespace, as ``(op, path, value)``."""

    def __init__(self, base: StatePath) -> None:
        self.base = base
        self.deletes: list[StatePath] = []
        self.sets: list[tuple[StatePath, Any]] = []
        self.forgotten: list[tuple[str, int]] = []  # (channel, log number) emptied


def plan_pruning(
    base: StatePath,
    data: dict[str, Any],
    keep: int,
    versions_of: Callable[[Any], dict[str, Any]],
) -> Pruning | None:
    """What to delete from ``data`` (a thread namespace) to keep ``keep`` checkpoints
    and the head of every branch; ``None`` while under ``keep`` plus the slack."""
    headers = {cid: header for held in data["checkpoints"].values() for cid, header in held.items()}
    if len(headers) <= keep + slack(keep):
        return None
    parents = {header["parent"] for header in headers.values()}
    kept = set(sorted(headers)[-keep:])
    kept |= {cid for cid in headers if cid not in parents}
    if data.get("latest") is not None:
        kept.add(data["latest"])
    dropped = [cid for cid in headers if cid not in kept]
    if not dropped:
        return None
    pruning = Pruning(base)
    for cid in dropped:
        held = bucket(cid)
        pruning.deletes.append([*base, "checkpoints", held, cid])
        if cid in data["writes"].get(held, {}):
            pruning.deletes.append([*base, "writes", held, cid])
    live: dict[str, set[str]] = {}
    for cid in kept:
        for channel, version in versions_of(headers[cid]["versions"]).items():
            live.setdefault(channel, set()).add(str(version))
    for channel, stored in data["channels"].items():
        held_versions = live.get(channel, set())
        read_logs: set[int] = set()
        for held, versions in stored["versions"].items():
            for version, known in versions.items():
                if version in held_versions:
                    if "log" in known:
                        read_logs.add(int(known["log"]))
                else:
                    pruning.deletes.append([*base, "channels", channel, "versions", held, version])
        logs = stored["logs"]
        for log_no, log in enumerate(logs):
            # The last log is the one a new version extends: never emptied.
            if log and log_no != len(logs) - 1 and log_no not in read_logs:
                pruning.sets.append(([*base, "channels", channel, "logs", log_no], []))
                pruning.forgotten.append((channel, log_no))
    return pruning
