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
- what a channel version holds, when small (a log's length, an empty channel, a
  scalar), is in the header of each checkpoint that has it (``held``), not an entry
  per channel and version of its own (which pruning would delete again one by one);
- pending writes are stored under their checkpoint, by task and index, once per
  checkpoint: held until the next ``put`` (or the turn's end, a tool call's save
  point), so that an item both written and then appended to a log — each step's new
  message, a ``Send`` — is stored once, in the log, and referred to by the write;
- ``latest`` is journaled once per save (the turn's end, a tool call's save point),
  not at every step.

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

A value that holds a list starting with the items of a channel's log — a ``Send``
of ``create_react_agent``, which hands each tool call a copy of the whole state —
stores a reference to that log instead of the items again (``codec``), so it costs
what it adds, not the conversation.

Items of a list channel are the cache's objects, shared with the graph: a node that
changes one in place (``state["items"][0]["n"] += 1``) changes what the next turn
reads, so the saver compares them with what it stored, by content, when the turn ends
and before each tool call's save point (``settle``), and journals what changed: the
owner and whoever folds the journal read the same. (Compared: plain JSON items
whole, a chat message's fields; an object LangGraph's serializer writes opaquely is
not.)

Checkpoints are pruned: the ``keep`` newest per thread (256 by default) and the head
of every branch stay (``shadowpod.integrations.langgraph.retention``). ``prune``,
``copy_thread``, ``delete_for_runs`` and ``delete_thread`` are LangGraph's own.

Writes happen inside a turn (``run_graph``, or ``with saver.bound(turn):``). Outside
an agent process, ``ShadowpodSaver(values=...)`` works on a state in memory (a
``DetachedState``): a state folded from a journal (``get_state_history``,
``update_state`` on it), or ``{}`` for a test or LangGraph's conformance suite;
``saver.values`` is that state as changed.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from operator import is_not
from typing import Any, Final, cast

from langchain_core.messages import BaseMessage, ToolMessage
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
from langgraph.types import Send
from pydantic import JsonValue

from shadowpod.agent import DetachedState, StateWriter, Turn
from shadowpod.agent.values import written_by_ops
from shadowpod.integrations.langgraph.codec import ITEM_REF, LOG_REF, REFS, ValueCodec
from shadowpod.integrations.langgraph.retention import (
    Pruning,
    bucket,
    headers_of,
    plan_pruning,
    plan_removal,
)
from shadowpod.integrations.langgraph.warmup import prime

logger = logging.getLogger(__name__)

ROOT: Final = "langgraph"  # the key of ``turn.values`` the checkpoints live under
HELD: Final = "held"  # a header's channels' small values (``_inline``), by channel
written_by_ops(ROOT)  # its in-place changes journaled by ``settle``, not by the turn
StatePath = list[str | int]
JsonList = list[Any]
CHUNK: Final = 256
DEFAULT_KEEP: Final = 256
# A list inside a value is stored as a reference to a log from this many items on.
MIN_REFERENCED: Final = 4
LogKey = tuple[str, str, str, int]  # thread, namespace, channel, log number


_EMPTY: Final = object()
_SCALARS: Final = (str, int, float, bool, type(None))


class NotInATurn(RuntimeError):
    def __init__(self) -> None:
        super().__init__(
            "ShadowpodSaver writes checkpoints inside a turn: in an agent, run the graph "
            "with graph_handler(saver, graph) or run_graph(saver, graph, turn, input), or "
            "inside `with saver.bound(turn):`; outside an agent (a test, an admin's "
            "update_state), build it on a state in memory: ShadowpodSaver(values={}) or "
            "ShadowpodSaver(values=state.agent.values)"
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
        retention``); ``None`` keeps them all, as LangGraph's own savers do.
        ``values``: outside an agent process, the agent state to work on (copied on
        write: the mapping given is never changed); ``saver.values`` is it as changed."""
        if keep is not None and keep < 1:
            raise ValueError(f"keep={keep}: keep at least the newest checkpoint, or None for all")
        super().__init__(serde=serde)
        self.keep = keep
        self.codec = ValueCodec(self.serde)
        self._detached = None if values is None else DetachedState(values)
        self._turn: ContextVar[Turn | None] = ContextVar(
            f"shadowpod-saver-{id(self)}", default=None
        )
        # Decoded items of each channel log, and what each held when stored or decoded
        # (``_mark``: to see a change made in place), by (thread, ns, channel, log).
        self._logs: dict[LogKey, list[Any]] = {}
        self._marks: dict[LogKey, list[Any]] = {}
        self._touched: set[LogKey] = set()  # logs whose items the graph got, since settled
        self.decoded = 0  # log items decoded, in all
        self.decoded_in_turns = 0  # of them, inside a turn (the rest: warm-ups, reads)
        self.journaled_calls: set[str] = set()  # tool call ids journaled in this turn
        # Pending writes not journaled yet, by (thread, ns, checkpoint id) and
        # ``task:index`` (``put_writes``); the items the last ``put`` appended to a log,
        # by id, with where (``_note_fresh``): what a held write refers to.
        self._held: dict[tuple[str, str, str], dict[str, tuple[str, Any, str, int]]] = {}
        self._fresh: dict[int, tuple[Any, str, int, int]] = {}
        self._fresh_in: tuple[str, str] = ("", "")
        self._latest: dict[tuple[str, str], str] = {}  # each namespace's, not journaled yet
        self._warned_calls: set[str] = set()

    @property
    def values(self) -> dict[str, Any]:
        """Outside an agent process: the agent state this saver works on, as changed."""
        if self._detached is None:
            raise RuntimeError(
                "this saver writes into turns, not into values of its own: build it with "
                "ShadowpodSaver(values=...) to work on a state in memory"
            )
        return self._detached.values

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
                inlined = header.get(HELD, {})
                for channel, version in self.codec.decode(header["versions"]).items():
                    stored = data["channels"].get(channel, {})
                    known = _expand(inlined.get(channel)) or stored.get("versions", {}).get(
                        bucket(str(version)), {}
                    ).get(str(version), {})
                    log_no = known.get("log")
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
        """Checkpoints written in this block go to ``turn``'s state; what the graph
        changed in place is journaled as the block ends (``settle``)."""
        token = self._turn.set(turn)
        self._touched.clear()
        self._held.clear()
        self._latest.clear()
        self.journaled_calls = set()
        try:
            yield turn
            self.settle()
        finally:
            if self._held or self._latest:  # a run that failed: what it wrote, as before
                self._flush(turn)
            self._fresh.clear()
            self._turn.reset(token)

    @property
    def turn(self) -> Turn | None:
        return self._turn.get()

    def _writer(self) -> StateWriter:
        turn = self._turn.get()
        if turn is not None:
            return turn
        if self._detached is not None:
            return self._detached
        raise NotInATurn

    def _root(self) -> Mapping[str, Any]:
        turn = self._turn.get()
        reader: StateWriter | None = turn if turn is not None else self._detached
        root = None if reader is None else reader.shared(ROOT)
        return root if isinstance(root, dict) else {}

    def _thread(self, thread: str, ns: str) -> dict[str, Any] | None:
        data = self._root().get(thread, {}).get(ns)
        return data if isinstance(data, dict) else None

    # --- reads ---------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._flush_held()
        thread, ns = _where(config)
        data = self._thread(thread, ns)
        if data is None:
            return None
        checkpoint_id = (
            get_checkpoint_id(config) or self._latest.get((thread, ns)) or data["latest"]
        )
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
        inlined = header.get(HELD, {})
        for channel, version in versions.items():
            known = _expand(inlined.get(channel))
            if known is None:
                versions_of = data["channels"].get(channel, {}).get("versions", {})
                known = versions_of.get(bucket(str(version)), {}).get(str(version))
            if (
                known is not None
                and (value := self._value(thread, ns, channel, data, known)) is not _EMPTY
            ):
                values[channel] = value
        writes = sorted(
            (
                _write(key, stored)
                for key, stored in data["writes"]
                .get(bucket(checkpoint_id), {})
                .get(checkpoint_id, {})
                .items()
            ),
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
        logs = self._reader(thread, ns, data)
        return CheckpointTuple(
            config=_config(thread, ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=self.codec.decode(header["metadata"]),
            parent_config=None if parent is None else _config(thread, ns, parent),
            pending_writes=[(w[0], w[1], self.codec.decode(w[2], logs)) for w in writes],
        )

    def _value(
        self, thread: str, ns: str, channel: str, data: dict[str, Any], known: dict[str, Any]
    ) -> Any:
        if "empty" in known:
            return _EMPTY
        if "value" in known:
            return self.codec.decode(known["value"], self._reader(thread, ns, data))
        log_no, length = known["log"], known["len"]
        items = self._items(thread, ns, channel, log_no, data["channels"][channel]["logs"][log_no])
        self._touched.add((thread, ns, channel, log_no))
        return items[:length]

    def _reader(self, thread: str, ns: str, data: dict[str, Any]) -> Any:
        """What resolves a stored reference to a log (``codec``) of this namespace."""

        def items_of(ref: list[Any]) -> list[Any]:
            # The whole log (not a copy): the codec takes what the reference names.
            channel, log_no = str(ref[0]), int(ref[1])
            log = data["channels"][channel]["logs"][log_no]
            self._touched.add((thread, ns, channel, log_no))
            return self._items(thread, ns, channel, log_no, log)

        return items_of

    def _items(self, thread: str, ns: str, channel: str, log_no: int, log: list[Any]) -> list[Any]:
        """The decoded items of a log (a list of chunks, all full but the last)."""
        key = (thread, ns, channel, log_no)
        items = self._logs.get(key)
        length = _length(log)
        if items is None or len(items) > length:
            items = self._logs[key] = []
            self._marks[key] = []
        if len(items) < length:
            self.decoded += length - len(items)
            if self._turn.get() is not None:
                self.decoded_in_turns += length - len(items)
        marks = self._marks[key]
        logs = None
        while len(items) < length:
            chunk, at = divmod(len(items), CHUNK)
            for stored in log[chunk][at:]:
                if type(stored) is dict and REFS in stored:
                    logs = logs or self._reader(thread, ns, self._thread(thread, ns) or {})
                item = self.codec.decode(stored, logs)
                items.append(item)
                marks.append(_mark(item, stored))
        return items

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        self._flush_held()
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
        writer = self._writer()
        thread, ns = _where(config)
        base = self._ensure(writer, thread, ns)
        data = self._thread(thread, ns)
        assert data is not None
        self._fresh = {}
        self._fresh_in = (thread, ns)
        known_by_channel: dict[str, JsonValue] = {}
        for channel, version in new_versions.items():
            if channel not in data["channels"]:
                writer.set([*base, "channels", channel], {"logs": [], "versions": {}})
                data = self._thread(thread, ns)
                assert data is not None
            value = checkpoint["channel_values"].get(channel, _EMPTY)
            known = self._store(writer, base, thread, ns, channel, data, value)
            data = self._thread(thread, ns)
            assert data is not None
            if (inline := _inline(known)) is not None:
                known_by_channel[channel] = inline
                continue
            versions_at = [*base, "channels", channel, "versions", bucket(str(version))]
            if versions_at[-1] not in data["channels"][channel]["versions"]:
                writer.set(versions_at, {})
            writer.set([*versions_at, str(version)], known)
            data = self._thread(thread, ns)
            assert data is not None
        parent_id = config["configurable"].get("checkpoint_id")
        for channel, version in checkpoint["channel_versions"].items():
            if (
                channel not in known_by_channel
                and (found := _known_in_headers(data, parent_id, channel, version)) is not None
            ):
                known_by_channel[channel] = found
        # The parent's pending writes, now that the items they wrote are in the logs:
        # an item both written and appended is stored once (``_flush_writes``).
        self._flush_writes(writer)
        checkpoint_id = checkpoint["id"]
        header = {
            "parent": parent_id,
            "v": checkpoint["v"],
            "ts": checkpoint["ts"],
            "versions": self.codec.encode(checkpoint["channel_versions"]),
            "seen": self.codec.encode(checkpoint["versions_seen"]),
            "updated": checkpoint.get("updated_channels"),
            "metadata": self.codec.encode(get_checkpoint_metadata(config, metadata)),
            # What each channel's version holds, where it is small (a log's length, an
            # empty channel, a scalar): in the header, not an entry of its own per
            # channel and version — which pruning would then delete one by one.
            HELD: known_by_channel,
        }
        held = bucket(checkpoint_id)
        if held not in data["checkpoints"]:
            writer.set([*base, "checkpoints", held], {checkpoint_id: header})
        else:
            writer.set([*base, "checkpoints", held, checkpoint_id], header)
        if self._turn.get() is None:
            writer.set([*base, "latest"], checkpoint_id)
        else:  # journaled once, as the turn ends or saves (``settle``): not every step
            self._latest[(thread, ns)] = checkpoint_id
        if self.keep is not None:
            data = self._thread(thread, ns)
            assert data is not None
            self._apply(writer, thread, ns, plan_pruning(base, data, self.keep, self.codec.decode))
        return _config(thread, ns, checkpoint_id)

    def _apply(self, writer: StateWriter, thread: str, ns: str, pruning: Pruning | None) -> None:
        if pruning is None:
            return
        for path in pruning.deletes:
            writer.delete(path)
        for path, value in pruning.sets:
            writer.set(path, value)
        for channel, log_no in pruning.forgotten:
            self._forget((thread, ns, channel, log_no))

    def _forget(self, key: LogKey) -> None:
        self._logs.pop(key, None)
        self._marks.pop(key, None)
        self._touched.discard(key)

    def _store(
        self,
        writer: StateWriter,
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
            return {"value": self._encode(value, thread, ns, data)}
        logs = data["channels"][channel]["logs"]
        log_no = len(logs) - 1
        if log_no >= 0:
            items = self._items(thread, ns, channel, log_no, logs[log_no])
            # The graph hands back the objects it was given: an unchanged prefix is
            # the same objects, compared by identity at C speed (what was changed in
            # place is found by content when the turn settles).
            if not any(map(is_not, items, value)):
                if len(value) > len(items):
                    key = (thread, ns, channel, log_no)
                    new = value[len(items) :]
                    encoded = [self._encode(item, thread, ns, data) for item in new]
                    self._extend(
                        writer, [*base, "channels", channel, "logs", log_no], logs[log_no], encoded
                    )
                    self._note_fresh(channel, log_no, len(items), new)
                    items.extend(new)
                    self._marks[key].extend(map(_mark, new, encoded))
                    self._touched.add(key)
                return {"log": log_no, "len": len(value)}
        encoded = [self._encode(item, thread, ns, data) for item in value]
        chunks = [encoded[at : at + CHUNK] for at in range(0, len(encoded), CHUNK)] or [[]]
        writer.append([*base, "channels", channel, "logs"], chunks)
        key = (thread, ns, channel, log_no + 1)
        self._note_fresh(channel, log_no + 1, 0, value)
        self._logs[key] = list(value)
        self._marks[key] = list(map(_mark, value, encoded))
        self._touched.add(key)
        return {"log": log_no + 1, "len": len(value)}

    def _note_fresh(self, channel: str, log_no: int, start: int, items: JsonList) -> None:
        """Items just appended to a log, which a pending write may refer to (``_flush_writes``)."""
        for index, item in enumerate(items, start):
            if type(item) not in _SCALARS:
                self._fresh[id(item)] = (item, channel, log_no, index)

    def _extend(self, writer: StateWriter, at: StatePath, log: JsonList, encoded: JsonList) -> None:
        """Append ``encoded`` items to a log: the last chunk filled first, then new chunks."""
        room = CHUNK - len(log[-1])
        if room > 0 and encoded:
            writer.append([*at, len(log) - 1], *encoded[:room])
            encoded = encoded[room:]
        for start in range(0, len(encoded), CHUNK):
            writer.append(at, encoded[start : start + CHUNK])

    def _encode(
        self, value: Any, thread: str, ns: str, data: dict[str, Any], *, bare: bool = False
    ) -> JsonValue:
        """``value`` as JSON, a list in it that starts with the items of one of this
        namespace's channel logs stored as a reference to them, and an item the last
        ``put`` appended to a log (``_fresh``) as a reference to it (wrapped with the
        logs it refers to: see the module's docstring). ``bare``: a pending write's
        value, which is not wrapped when it is an item reference or a list of them and
        items (retention finds those: ``retention.written_logs``)."""
        if type(value) not in (list, dict, Send) and id(value) not in self._fresh:
            return self.codec.encode(value)
        last_logs = [
            (channel, len(stored["logs"]) - 1)
            for channel, stored in data["channels"].items()
            if stored["logs"]
        ]
        used: list[list[JsonValue]] = []

        def reference(items: list[Any]) -> dict[str, JsonValue] | None:
            if len(items) < MIN_REFERENCED:
                return None
            for channel, log_no in last_logs:
                known = self._logs.get((thread, ns, channel, log_no))
                if not known or known[0] is not items[0]:
                    continue
                if len(known) != _length(data["channels"][channel]["logs"][log_no]):
                    continue
                n = min(len(known), len(items))
                if any(map(is_not, known[:n], items[:n])):
                    continue
                if [channel, log_no] not in used:
                    used.append([channel, log_no])
                ref: dict[str, JsonValue] = {LOG_REF: [channel, log_no, n]}
                if len(items) > n:
                    ref["+"] = [self.codec.encode(item, reference) for item in items[n:]]
                return ref
            return None

        def appended(item: Any) -> JsonValue | None:
            found = self._fresh.get(id(item)) if self._fresh_in == (thread, ns) else None
            if found is None or found[0] is not item:
                return None
            _, channel, log_no, index = found
            if [channel, log_no] not in used:
                used.append([channel, log_no])
            item_refs.append(1)
            ref: JsonValue = {ITEM_REF: [channel, log_no, index]}
            return ref

        item_refs: list[int] = []
        encoded = self.codec.encode(value, reference, appended if self._fresh else None)
        if bare and used and len(item_refs) == len(_top_item_refs(encoded)):
            return encoded  # item references only, where retention looks for them
        if not used:
            return encoded
        wrapped: JsonValue = {REFS: used, "$value": encoded}  # type: ignore[dict-item]
        return wrapped

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Held until the next ``put`` (or the turn's end, a tool call's save point, a
        read of them): a write's item that ``put`` then appends to a channel's log — a
        node's new message, a ``Send`` — is stored once, in the log, and referred to."""
        self._writer()
        thread, ns = _where(config)
        checkpoint_id = config["configurable"]["checkpoint_id"]
        data = self._thread(thread, ns)
        stored = {} if data is None else data["writes"].get(bucket(checkpoint_id), {})
        stored = stored.get(checkpoint_id, {})
        held = self._held.setdefault((thread, ns, checkpoint_id), {})
        for index, (channel, value) in enumerate(writes):
            write_index = WRITES_IDX_MAP.get(channel, index)
            key = f"{task_id}:{write_index}"
            if write_index >= 0 and (key in stored or key in held):
                continue
            self._check_journaled(value)
            held[key] = (channel, value, task_path, write_index)
        if self._turn.get() is None:
            self._flush(self._writer())

    def _flush_held(self) -> None:
        if self._held or self._latest:
            self._flush(self._writer())

    def _flush(self, writer: StateWriter) -> None:
        self._flush_writes(writer)
        latest, self._latest = self._latest, {}
        for (thread, ns), checkpoint_id in latest.items():
            if self._thread(thread, ns) is not None:
                writer.set([ROOT, thread, ns, "latest"], checkpoint_id)

    def _flush_writes(self, writer: StateWriter) -> None:
        """Journal the pending writes held (``put_writes``): one change per checkpoint,
        each write ``[channel, value, task path, index]`` under ``task:index``."""
        held, self._held = self._held, {}
        for (thread, ns, checkpoint_id), writes in held.items():
            base = self._ensure(writer, thread, ns)
            data = self._thread(thread, ns)
            assert data is not None
            encoded = {
                key: [channel, self._encode(value, thread, ns, data, bare=True), task_path, index]
                for key, (channel, value, task_path, index) in writes.items()
            }
            at = bucket(checkpoint_id)
            if at not in data["writes"]:
                writer.set([*base, "writes", at], {checkpoint_id: encoded})
            elif checkpoint_id not in data["writes"][at]:
                writer.set([*base, "writes", at, checkpoint_id], encoded)
            else:
                for key, write in encoded.items():
                    writer.set([*base, "writes", at, checkpoint_id, key], write)

    def _check_journaled(self, value: Any) -> None:
        """Warn of a tool's result whose call was not journaled: a ``ToolNode`` run in a
        turn outside ``run_graph`` / ``journal_tools`` (its side effect would be repeated
        by a new owner)."""
        turn = self._turn.get()
        if turn is None:
            return
        found = value if type(value) is list else [value]
        for message in found:
            if not isinstance(message, ToolMessage):
                continue
            call_id = message.tool_call_id
            if (
                call_id in self.journaled_calls
                or f"{turn.seq}:{call_id}" in turn.state.tools.calls
                or call_id in self._warned_calls
            ):
                continue
            self._warned_calls.add(call_id)
            logger.warning(
                "tool %r (call %s) ran without being journaled: after an owner change it "
                "would run again. Run the graph with graph_handler or run_graph (they "
                "journal every ToolNode), or call journal_tools(saver, graph) once",
                message.name,
                call_id,
            )

    # --- threads -------------------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        writer = self._writer()
        self._held = {key: held for key, held in self._held.items() if key[0] != thread_id}
        self._latest = {key: cid for key, cid in self._latest.items() if key[0] != thread_id}
        self._fresh.clear()
        if thread_id in self._root():
            writer.delete([ROOT, thread_id])
        for key in [key for key in self._logs if key[0] == thread_id]:
            self._forget(key)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (with their pending writes) of the runs ``run_ids``
        (their metadata's ``run_id``), in every thread; ``latest`` falls back to the
        newest one left."""
        wanted = set(run_ids)
        if not wanted:
            return
        writer = self._writer()
        self._flush_held()
        for thread, spaces in list(self._root().items()):
            for ns, data in list(spaces.items()):
                headers = headers_of(data)
                kept = {
                    cid
                    for cid, header in headers.items()
                    if self.codec.decode(header["metadata"]).get("run_id") not in wanted
                }
                pruning = plan_removal([ROOT, thread, ns], data, kept, self.codec.decode)
                self._apply(writer, thread, ns, pruning)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint (each namespace, pending writes, channel values) of
        one thread to another (replacing what that one held)."""
        writer = self._writer()
        self._flush_held()
        self._fresh.clear()
        source = self._root().get(source_thread_id)
        if source is None:
            return
        self._ensure_root(writer)
        writer.set([ROOT, target_thread_id], source)
        for key in [key for key in self._logs if key[0] == target_thread_id]:
            self._forget(key)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """LangGraph's pruning: ``keep_latest`` keeps each namespace's latest
        checkpoint (and its pending writes), ``delete`` the thread's every one."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown pruning strategy {strategy!r}: keep_latest or delete")
        writer = self._writer()
        self._flush_held()
        for thread in thread_ids:
            spaces = self._root().get(thread)
            if spaces is None:
                continue
            if strategy == "delete":
                self.delete_thread(thread)
                continue
            for ns, data in list(spaces.items()):
                latest = data.get("latest")
                kept = set() if latest is None else {latest}
                self._apply(
                    writer,
                    thread,
                    ns,
                    plan_removal([ROOT, thread, ns], data, kept, self.codec.decode),
                )

    # --- in-place changes ----------------------------------------------------------------

    def settle(self) -> None:
        """Journal what the graph changed in place in the items of the list channels it
        was given since the last call: each such item set anew, at its place in its log
        (so the owner and a state folded from the journal read the same)."""
        turn = self._turn.get()
        writer: StateWriter | None = turn if turn is not None else self._detached
        if writer is None:
            return
        if self._held or self._latest:
            self._flush(writer)
        for key in sorted(self._touched):
            items, marks = self._logs.get(key), self._marks.get(key)
            if items is None or marks is None:
                continue
            if not any(map(_differs, items, marks)):
                continue
            thread, ns, channel, log_no = key
            data = self._thread(thread, ns)
            if data is None:
                continue
            for index, (item, mark) in enumerate(zip(items, marks, strict=True)):
                if not _differs(item, mark):
                    continue
                encoded = self._encode(item, thread, ns, data)
                chunk, at = divmod(index, CHUNK)
                path: StatePath = [ROOT, thread, ns, "channels", channel, "logs", log_no, chunk, at]
                writer.set(path, encoded)
                marks[index] = _mark(item, encoded)
        self._touched.clear()

    # --- storage -------------------------------------------------------------------------

    def _ensure_root(self, writer: StateWriter) -> None:
        if not isinstance(writer.shared(ROOT), dict):
            writer.set(ROOT, {})

    def _ensure(self, writer: StateWriter, thread: str, ns: str) -> StatePath:
        self._ensure_root(writer)
        root = self._root()
        if thread not in root:
            writer.set([ROOT, thread], {})
        if ns not in self._root()[thread]:
            writer.set(
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

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.prune(thread_ids, strategy=strategy)


def _write(key: str, stored: list[Any]) -> tuple[str, str, Any, str, int]:
    """A stored pending write as ``(task id, channel, value, task path, index)``: as
    written now (``[channel, value, task path, index]`` under ``task:index``), or
    before 27 Nov (``[task id, channel, value, task path, index]``)."""
    if len(stored) == 5:
        return (stored[0], stored[1], stored[2], stored[3], stored[4])
    return (key.rsplit(":", 1)[0], stored[0], stored[1], stored[2], stored[3])


def _top_item_refs(encoded: Any) -> list[Any]:
    """The item references (``{"$item": ...}``) that ``encoded`` is or holds at its top."""
    found = encoded if type(encoded) is list else [encoded]
    return [item for item in found if type(item) is dict and ITEM_REF in item and len(item) == 1]


def _inline(known: dict[str, JsonValue]) -> JsonValue | None:
    """What a channel version holds as its checkpoint's header holds it (``HELD``), if
    it is small: a log's length ``[log, length]``, an empty channel ``0``, a scalar
    value ``[value]``; ``None``: too large for every header that keeps it."""
    if "log" in known:
        return [known["log"], known["len"]]
    if "empty" in known:
        return 0
    value = known["value"]
    if value is None or type(value) in (bool, int) or (type(value) is str and len(value) <= 64):
        return [value]
    return None


def _expand(inline: Any) -> dict[str, Any] | None:
    """``_inline``'s form back as a channel version's entry (``None`` for ``None``)."""
    if inline is None:
        return None
    if inline == 0:
        return {"empty": True}
    if len(inline) == 2:
        return {"log": inline[0], "len": inline[1]}
    return {"value": inline[0]}


def _known_in_headers(
    data: dict[str, Any], parent_id: str | None, channel: str, version: Any
) -> JsonValue | None:
    """What ``channel`` at ``version`` holds, as a header holds it: the parent's (where
    a version not new in a checkpoint mostly comes from), else any header's (a
    checkpoint put from elsewhere); ``None``: in the channel's versions, if anywhere."""
    parent = data["checkpoints"].get(bucket(parent_id), {}).get(parent_id) if parent_id else None
    if parent is not None and parent["versions"].get(channel) == version:
        found = parent.get(HELD, {}).get(channel)
        if found is not None:
            return cast(JsonValue, found)
    versions = data["channels"].get(channel, {}).get("versions", {})
    if str(version) in versions.get(bucket(str(version)), {}):
        return None
    for header in headers_of(data).values():  # rare: not from the parent
        found = header.get(HELD, {}).get(channel)
        if found is not None and header["versions"].get(channel) == version:
            return cast(JsonValue, found)
    return None


def _length(log: list[Any]) -> int:
    """The items of a log (a list of chunks, all full but the last)."""
    return (len(log) - 1) * CHUNK + len(log[-1]) if log else 0


def _mark(item: Any, stored: Any) -> Any:
    """What ``item`` held when it was stored (or decoded from) ``stored``, to compare
    with (``_differs``): a chat message's fields (a shallow copy: what is reassigned);
    a plain JSON item its JSON (or a deep copy, if its JSON says it otherwise); any other
    item itself (an immutable one cannot change; an opaque object is not compared)."""
    if isinstance(item, BaseMessage):
        return dict(item.__dict__)
    if type(item) in (dict, list):
        return stored if item == stored else copy.deepcopy(item)
    return item


def _differs(item: Any, mark: Any) -> bool:
    if isinstance(item, BaseMessage):
        return bool(item.__dict__ != mark)
    return item is not mark and bool(item != mark)


def _where(config: RunnableConfig) -> tuple[str, str]:
    configurable = config["configurable"]
    return str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))


def _config(thread: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
    }
