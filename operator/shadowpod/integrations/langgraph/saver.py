"""A LangGraph checkpointer backed by the session journal.

``ShadowpodSaver`` keeps a graph's checkpoints in the agent's own state
(``turn.values["langgraph"]``), so they are journaled with the turn that made them,
folded by every shadow, carried by snapshots and migrated with the session. It
writes them as deltas, so one more turn costs the same at turn 10 and at turn
10,000 — where a saver that stores every channel version whole (LangGraph's
``SqliteSaver``) writes the whole conversation again at every step:

- a checkpoint is its header (id, parent, channel versions, metadata): a ``set``;
- a list channel (``messages``) is an append-only log per channel, and each of its
  versions is a length of that log: a version that extends the last one appends its
  new items, one that shrank is a shorter length, anything else starts a new log;
- any other channel version is stored as its value;
- pending writes are stored under their checkpoint, by task and index.

The maps that grow with the conversation (headers and writes by checkpoint id,
channel versions) are split into ``BUCKETS`` fixed buckets by a stable hash of
their key (``retention.bucket``), and a log into chunks of ``CHUNK`` items: a write
copies (copy-on-write, in the turn and in every fold) one bucket or chunk, not a
map of every checkpoint —
so the CPU of one more turn, like its bytes, stays flat as the conversation grows.

Reads decode from the journaled JSON (a per-process cache of decoded log items keeps
them O(change) too: the cache, not the journal, is what a new owner rebuilds). A
shadow fills that cache before it is promoted (``agent.on_shadow_ready(saver.warm)``),
so the new owner's first turn does not decode the whole conversation in the fence
pause; ``decoded_in_turns`` counts the items decoded inside turns.

Checkpoints are pruned: the ``keep`` newest per thread (256 by default) and the head
of every branch stay (``shadowpod.integrations.langgraph.retention``).

Writes happen inside a turn (``saver.bound(turn)`` or ``saver.ainvoke``); outside
one, a saver built on some state's values (``ShadowpodSaver(values=...)``) reads
(``get_state_history`` on a folded journal, for instance).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from operator import is_not
from typing import Any, Final

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from pydantic import JsonValue

from shadowpod.agent import Turn
from shadowpod.integrations.langgraph.codec import ValueCodec
from shadowpod.integrations.langgraph.retention import bucket, plan_pruning
from shadowpod.integrations.langgraph.warmup import prime

ROOT: Final = "langgraph"  # the key of ``turn.values`` the checkpoints live under
StatePath = list[str | int]
JsonList = list[Any]
CHUNK: Final = 256
DEFAULT_KEEP: Final = 256


_EMPTY: Final = object()


class NotInATurn(RuntimeError):
    def __init__(self) -> None:
        super().__init__(
            "ShadowpodSaver writes checkpoints inside a turn only: run the graph with "
            "saver.ainvoke(graph, turn, input), or inside `with saver.bound(turn):`"
        )


class ShadowpodSaver(BaseCheckpointSaver[str]):
    def __init__(
        self,
        *,
        values: Mapping[str, Any] | None = None,
        serde: SerializerProtocol | None = None,
        keep: int | None = DEFAULT_KEEP,
    ) -> None:
        """``keep``: the checkpoints kept per thread (and namespace), the newest,
        besides the head of every branch (``shadowpod.integrations.langgraph.
        retention``); ``None`` keeps them all, as LangGraph's own savers do."""
        if keep is not None and keep < 1:
            raise ValueError(f"keep={keep}: keep at least the newest checkpoint, or None for all")
        super().__init__(serde=serde)
        self.keep = keep
        self.codec = ValueCodec(self.serde)
        self._values = values
        self._turn: ContextVar[Turn | None] = ContextVar(
            f"shadowpod-saver-{id(self)}", default=None
        )
        # Decoded items of each channel log, by (thread, ns, channel, log number).
        self._logs: dict[tuple[str, str, str, int], list[Any]] = {}
        self.decoded = 0  # log items decoded, in all
        self.decoded_in_turns = 0  # of them, inside a turn (the rest: warm-ups, reads)

    def warm(self, values: Mapping[str, Any]) -> None:
        """Decode, into the cache the turns read from, the logs the latest checkpoint
        of every thread reads: only their items new since the last call. Writes
        nothing. For ``agent.on_shadow_ready(saver.warm)``."""
        root = values.get(ROOT)
        if not isinstance(root, dict):
            return
        for thread, spaces in root.items():
            for ns, data in spaces.items():
                latest = data.get("latest")
                header = data["checkpoints"].get(bucket(latest), {}).get(latest) if latest else None
                if header is None:
                    continue
                for channel, version in self.codec.decode(header["versions"]).items():
                    stored = data["channels"].get(channel, {})
                    known = stored.get("versions", {}).get(bucket(str(version)), {})
                    log_no = known.get(str(version), {}).get("log")
                    if log_no is not None:
                        self._items(thread, ns, channel, log_no, stored["logs"][log_no])

    async def prime(self) -> None:
        """Pay, on throwaway input, what a process's first graph run costs — LangChain's
        lazy imports and caches, LangGraph's first Pregel run, this saver's codec — so
        that a new owner's first turn after a move does not (``agent.on_start(saver.
        prime)``; ``shadowpod.integrations.langgraph.warmup``). No model or tool of the
        agent is called; nothing is written; no turn is needed."""
        await prime(self.codec)

    # --- binding to a turn ---------------------------------------------------------------

    @contextmanager
    def bound(self, turn: Turn) -> Iterator[Turn]:
        """Checkpoints written in this block go to ``turn``'s state."""
        token = self._turn.set(turn)
        try:
            yield turn
        finally:
            self._turn.reset(token)

    @property
    def turn(self) -> Turn | None:
        return self._turn.get()

    def _writer(self) -> Turn:
        turn = self._turn.get()
        if turn is None:
            raise NotInATurn
        return turn

    def _root(self) -> Mapping[str, Any]:
        turn = self._turn.get()
        values = turn.values if turn is not None else self._values
        root = None if values is None else values.get(ROOT)
        return root if isinstance(root, dict) else {}

    def _thread(self, thread: str, ns: str) -> dict[str, Any] | None:
        data = self._root().get(thread, {}).get(ns)
        return data if isinstance(data, dict) else None

    # --- reads ---------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread, ns = _where(config)
        data = self._thread(thread, ns)
        if data is None:
            return None
        checkpoint_id = get_checkpoint_id(config) or data["latest"]
        if checkpoint_id is None or checkpoint_id not in data["checkpoints"].get(
            bucket(checkpoint_id), {}
        ):
            return None
        return self._tuple(thread, ns, data, checkpoint_id)

    def _tuple(
        self, thread: str, ns: str, data: dict[str, Any], checkpoint_id: str
    ) -> CheckpointTuple:
        header = data["checkpoints"][bucket(checkpoint_id)][checkpoint_id]
        versions: ChannelVersions = self.codec.decode(header["versions"])
        values: dict[str, Any] = {}
        for channel, version in versions.items():
            versions_of = data["channels"].get(channel, {}).get("versions", {})
            known = versions_of.get(bucket(str(version)), {}).get(str(version))
            if (
                known is not None
                and (value := self._value(thread, ns, channel, data, known)) is not _EMPTY
            ):
                values[channel] = value
        writes = sorted(
            data["writes"].get(bucket(checkpoint_id), {}).get(checkpoint_id, {}).values(),
            key=lambda w: writes_sort_key(w[3], w[0], w[4]),
        )
        checkpoint: Checkpoint = {
            "v": header["v"],
            "id": checkpoint_id,
            "ts": header["ts"],
            "channel_values": values,
            "channel_versions": versions,
            "versions_seen": self.codec.decode(header["seen"]),
            "updated_channels": header["updated"],
        }
        parent = header["parent"]
        return CheckpointTuple(
            config=_config(thread, ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=self.codec.decode(header["metadata"]),
            parent_config=None if parent is None else _config(thread, ns, parent),
            pending_writes=[(w[0], w[1], self.codec.decode(w[2])) for w in writes],
        )

    def _value(
        self, thread: str, ns: str, channel: str, data: dict[str, Any], known: dict[str, Any]
    ) -> Any:
        if "empty" in known:
            return _EMPTY
        if "value" in known:
            return self.codec.decode(known["value"])
        log_no, length = known["log"], known["len"]
        items = self._items(thread, ns, channel, log_no, data["channels"][channel]["logs"][log_no])
        return items[:length]

    def _items(self, thread: str, ns: str, channel: str, log_no: int, log: list[Any]) -> list[Any]:
        """The decoded items of a log (a list of chunks, all full but the last)."""
        key = (thread, ns, channel, log_no)
        items = self._logs.get(key)
        length = (len(log) - 1) * CHUNK + len(log[-1]) if log else 0
        if items is None or len(items) > length:
            items = self._logs[key] = []
        if len(items) < length:
            self.decoded += length - len(items)
            if self._turn.get() is not None:
                self.decoded_in_turns += length - len(items)
        while len(items) < length:
            chunk, at = divmod(len(items), CHUNK)
            items.extend(self.codec.decode(item) for item in log[chunk][at:])
        return items

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        root = self._root()
        threads = [config["configurable"]["thread_id"]] if config else list(root)
        wanted_ns = config["configurable"].get("checkpoint_ns") if config else None
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        for thread in threads:
            for ns, data in root.get(thread, {}).items():
                if wanted_ns is not None and ns != wanted_ns:
                    continue
                known = [cid for held in data["checkpoints"].values() for cid in held]
                for checkpoint_id in sorted(known, reverse=True):
                    if wanted_id and checkpoint_id != wanted_id:
                        continue
                    if before_id and checkpoint_id >= before_id:
                        continue
                    found = self._tuple(thread, ns, data, checkpoint_id)
                    if filter and any(found.metadata.get(k) != v for k, v in filter.items()):
                        continue
                    if limit is not None:
                        if limit <= 0:
                            return
                        limit -= 1
                    yield found

    # --- writes --------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        turn = self._writer()
        thread, ns = _where(config)
        base = self._ensure(turn, thread, ns)
        data = self._thread(thread, ns)
        assert data is not None
        for channel, version in new_versions.items():
            if channel not in data["channels"]:
                turn.set([*base, "channels", channel], {"logs": [], "versions": {}})
                data = self._thread(thread, ns)
                assert data is not None
            value = checkpoint["channel_values"].get(channel, _EMPTY)
            known = self._store(turn, base, thread, ns, channel, data, value)
            versions_at = [*base, "channels", channel, "versions", bucket(str(version))]
            if versions_at[-1] not in data["channels"][channel]["versions"]:
                turn.set(versions_at, {})
            turn.set([*versions_at, str(version)], known)
            data = self._thread(thread, ns)
            assert data is not None
        checkpoint_id = checkpoint["id"]
        header = {
            "parent": config["configurable"].get("checkpoint_id"),
            "v": checkpoint["v"],
            "ts": checkpoint["ts"],
            "versions": self.codec.encode(checkpoint["channel_versions"]),
            "seen": self.codec.encode(checkpoint["versions_seen"]),
            "updated": checkpoint.get("updated_channels"),
            "metadata": self.codec.encode(get_checkpoint_metadata(config, metadata)),
        }
        held = bucket(checkpoint_id)
        if held not in data["checkpoints"]:
            turn.set([*base, "checkpoints", held], {})
        turn.set([*base, "checkpoints", held, checkpoint_id], header)
        turn.set([*base, "latest"], checkpoint_id)
        if self.keep is not None:
            self._prune(turn, base, thread, ns)
        return _config(thread, ns, checkpoint_id)

    def _prune(self, turn: Turn, base: StatePath, thread: str, ns: str) -> None:
        data = self._thread(thread, ns)
        assert data is not None and self.keep is not None
        pruning = plan_pruning(base, data, self.keep, self.codec.decode)
        if pruning is None:
            return
        for path in pruning.deletes:
            turn.delete(path)
        for path, value in pruning.sets:
            turn.set(path, value)
        for channel, log_no in pruning.forgotten:
            self._logs.pop((thread, ns, channel, log_no), None)

    def _store(
        self,
        turn: Turn,
        base: StatePath,
        thread: str,
        ns: str,
        channel: str,
        data: dict[str, Any],
        value: Any,
    ) -> dict[str, JsonValue]:
        if value is _EMPTY:
            return {"empty": True}
        if type(value) is not list:
            return {"value": self.codec.encode(value)}
        logs = data["channels"][channel]["logs"]
        log_no = len(logs) - 1
        if log_no >= 0:
            items = self._items(thread, ns, channel, log_no, logs[log_no])
            # The graph hands back the objects it was given: an unchanged prefix is
            # the same objects, compared by identity at C speed.
            if not any(map(is_not, items, value)):
                if len(value) > len(items):
                    self._extend(
                        turn,
                        [*base, "channels", channel, "logs", log_no],
                        logs[log_no],
                        value[len(items) :],
                    )
                    items.extend(value[len(items) :])
                return {"log": log_no, "len": len(value)}
        encoded = [self.codec.encode(v) for v in value]
        chunks = [encoded[at : at + CHUNK] for at in range(0, len(encoded), CHUNK)] or [[]]
        turn.append([*base, "channels", channel, "logs"], chunks)
        self._logs[(thread, ns, channel, log_no + 1)] = list(value)
        return {"log": log_no + 1, "len": len(value)}

    def _extend(self, turn: Turn, at: StatePath, log: JsonList, new: JsonList) -> None:
        """Append ``new`` to a log: the last chunk filled first, then new chunks."""
        encoded = [self.codec.encode(item) for item in new]
        room = CHUNK - len(log[-1])
        if room > 0 and encoded:
            turn.append([*at, len(log) - 1], *encoded[:room])
            encoded = encoded[room:]
        for start in range(0, len(encoded), CHUNK):
            turn.append(at, encoded[start : start + CHUNK])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        turn = self._writer()
        thread, ns = _where(config)
        base = self._ensure(turn, thread, ns)
        checkpoint_id = config["configurable"]["checkpoint_id"]
        held = bucket(checkpoint_id)
        data = self._thread(thread, ns)
        assert data is not None
        if held not in data["writes"]:
            turn.set([*base, "writes", held], {})
        if checkpoint_id not in self._thread(thread, ns)["writes"][held]:  # type: ignore[index]
            turn.set([*base, "writes", held, checkpoint_id], {})
        stored = self._thread(thread, ns)["writes"][held][checkpoint_id]  # type: ignore[index]
        for index, (channel, value) in enumerate(writes):
            write_index = WRITES_IDX_MAP.get(channel, index)
            key = f"{task_id}:{write_index}"
            if write_index >= 0 and key in stored:
                continue
            turn.set(
                [*base, "writes", held, checkpoint_id, key],
                [task_id, channel, self.codec.encode(value), task_path, write_index],
            )

    def delete_thread(self, thread_id: str) -> None:
        turn = self._writer()
        if thread_id in self._root():
            turn.delete([ROOT, thread_id])
        for key in [key for key in self._logs if key[0] == thread_id]:
            del self._logs[key]

    def _ensure(self, turn: Turn, thread: str, ns: str) -> StatePath:
        if not isinstance(turn.values.get(ROOT), dict):
            turn.set(ROOT, {})
        root = self._root()
        if thread not in root:
            turn.set([ROOT, thread], {})
        if ns not in self._root()[thread]:
            turn.set(
                [ROOT, thread, ns],
                {"latest": None, "checkpoints": {}, "channels": {}, "writes": {}},
            )
        return [ROOT, thread, ns]

    def get_next_version(self, current: str | None, channel: None) -> str:
        # As LangGraph's own savers: a random part keeps a version made on a fork (a
        # run from an earlier checkpoint) from colliding with the one made before.
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:016}.{random.getrandbits(32):08x}"

    # --- async ---------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in self.list(config, filter=filter, before=before, limit=limit):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.delete_thread(thread_id)


def _where(config: RunnableConfig) -> tuple[str, str]:
    configurable = config["configurable"]
    return str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))


def _config(thread: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
    }
