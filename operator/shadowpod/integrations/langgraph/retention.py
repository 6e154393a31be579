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
    headers = headers_of(data)
    if len(headers) <= keep + slack(keep):
        return None
    parents = {header["parent"] for header in headers.values()}
    kept = set(sorted(headers)[-keep:])
    kept |= {cid for cid in headers if cid not in parents}
    if data.get("latest") is not None:
        kept.add(data["latest"])
    return plan_removal(base, data, kept, versions_of)


def headers_of(data: dict[str, Any]) -> dict[str, Any]:
    """Every checkpoint header of a thread namespace, by checkpoint id."""
    return {cid: header for held in data["checkpoints"].values() for cid, header in held.items()}


def plan_removal(
    base: StatePath,
    data: dict[str, Any],
    kept: set[str],
    versions_of: Callable[[Any], dict[str, Any]],
) -> Pruning | None:
    """What to delete from ``data`` to keep only the checkpoints ``kept``: the others'
    headers and pending writes, the channel versions no kept checkpoint holds, the logs
    no kept version reads (emptied: versions name logs by number), and ``latest`` when
    it is not kept (the newest kept one then, or none). ``None``: nothing to remove."""
    headers = headers_of(data)
    dropped = [cid for cid in headers if cid not in kept]
    if not dropped:
        return None
    pruning = Pruning(base)
    for cid in dropped:
        held = bucket(cid)
        pruning.deletes.append([*base, "checkpoints", held, cid])
        if cid in data["writes"].get(held, {}):
            pruning.deletes.append([*base, "writes", held, cid])
    if data.get("latest") not in kept:
        survivors = sorted(cid for cid in headers if cid in kept)
        pruning.sets.append(([*base, "latest"], survivors[-1] if survivors else None))
    live: dict[str, set[str]] = {}
    read_by_headers: dict[str, set[int]] = {}
    for cid in kept & headers.keys():
        for channel, version in versions_of(headers[cid]["versions"]).items():
            live.setdefault(channel, set()).add(str(version))
        # What a header holds itself (``ShadowpodSaver.put``): ``[log, length]`` read a
        # log; ``0`` (empty) and ``[value]`` none.
        for channel, held in headers[cid].get("held", {}).items():
            if type(held) is list and len(held) == 2:
                read_by_headers.setdefault(channel, set()).add(int(held[0]))
    read_by_writes = referenced_logs(data, kept, live, read_by_headers)
    for channel, stored in data["channels"].items():
        held_versions = live.get(channel, set())
        read_logs = set(read_by_writes.get(channel, ())) | read_by_headers.get(channel, set())
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


REFS: Final = "$refs"  # a stored value's wrapper naming the logs it refers to


ITEM_REF: Final = "$item"  # a pending write's reference to a log item, unwrapped


def written_logs(value: Any) -> list[tuple[str, int]]:
    """The logs a pending write's value refers to by item references at its top (a
    write that is a log item, or a list of them: not wrapped in ``$refs``)."""
    found = value if type(value) is list else [value]
    return [
        (str(item[ITEM_REF][0]), int(item[ITEM_REF][1]))
        for item in found
        if type(item) is dict and ITEM_REF in item and len(item) == 1
    ]


def referenced_logs(
    data: dict[str, Any],
    kept: set[str],
    live: dict[str, set[str]],
    read_by_headers: dict[str, set[int]] | None = None,
) -> dict[str, set[int]]:
    """The logs that what is kept refers to, by channel: the values of the kept
    checkpoints' pending writes, of the channel versions they hold (``live``), and of
    the items of the logs those versions read (a ``Send`` of ``create_react_agent``
    refers to the messages' log). Only the top of each value is looked at: a value
    holding references says so there (``shadowpod.integrations.langgraph.codec``)."""
    found: dict[str, set[int]] = {}

    def note(value: Any) -> None:
        if type(value) is dict and REFS in value:
            for channel, log_no in value[REFS]:
                found.setdefault(str(channel), set()).add(int(log_no))

    for held in data["writes"].values():
        for cid, writes in held.items():
            if cid in kept:
                for write in writes.values():
                    # [task, channel, value, path, index], or since 27 Nov without the task
                    value = write[2] if len(write) == 5 else write[1]
                    note(value)
                    for channel, log_no in written_logs(value):
                        found.setdefault(str(channel), set()).add(int(log_no))
    for channel, stored in data["channels"].items():
        wanted = live.get(channel, set())
        read = set((read_by_headers or {}).get(channel, ()))
        for versions in stored["versions"].values():
            for version, known in versions.items():
                if version in wanted:
                    if "value" in known:
                        note(known["value"])
                    elif "log" in known:
                        read.add(int(known["log"]))
        for log_no in read:
            for chunk in stored["logs"][log_no]:
                for item in chunk:
                    note(item)
    return found
