"""``ShadowpodSaver.prime`` (``agent.on_start(saver.prime)``): a process's first
LangGraph run paid on throwaway input, before a session needs the process. After it,
the agent's first real turns — a plain answer and a tool call — import nothing more
of LangChain or LangGraph (without it, they do), and nothing was journaled by it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import asyncio, json, sys
from pathlib import Path
from shadowpod.bench.langgraph import SESSION, _build_graph, _Owner
from shadowpod.domain.ownership import Ownership
from shadowpod.integrations.langgraph import ShadowpodSaver
from shadowpod.journal.sqlite.store import SQLiteJournalStore

async def main(workdir, prime):
    store = SQLiteJournalStore(Path(workdir) / "journal.db")
    await store.open()
    await store.create_session(SESSION)
    await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="test"))
    saver = ShadowpodSaver()
    owner = _Owner(store, _build_graph()(saver), saver)
    head = len(await store.read(SESSION, after=0))  # the ownership entry
    if prime:
        await saver.prime()
    journaled = len(await store.read(SESSION, after=0)) - head
    before = set(sys.modules)
    await owner.turn("hello")
    await owner.turn("lookup Oslo")
    new = sorted(m for m in set(sys.modules) - before if m.startswith(("langchain", "langgraph")))
    state = owner.folder.peek()
    await store.close()
    print(json.dumps({"new": new, "journaled_by_prime": journaled,
                      "replies": [m.content for m in state.transcript if m.role == "assistant"]}))

asyncio.run(main(sys.argv[1], sys.argv[2] == "prime"))
"""


def _first_turns(tmp_path: Path, mode: str) -> dict[str, object]:
    workdir = tmp_path / mode
    workdir.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(workdir), mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "TOOL_LOG": str(workdir / "tools.log")},
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, object] = json.loads(result.stdout.splitlines()[-1])
    return report


def test_after_the_prime_the_first_turns_import_nothing_more(tmp_path: Path) -> None:
    cold = _first_turns(tmp_path, "cold")
    primed = _first_turns(tmp_path, "prime")
    assert cold["new"], "a first LangGraph run imports modules lazily (what the prime pays)"
    assert primed["new"] == []
    # The prime touched neither the session's journal nor the agent's tools, and the
    # turns after it answered as they do without it.
    assert primed["journaled_by_prime"] == 0
    ran = (tmp_path / "prime" / "tools.log").read_text().splitlines()
    assert [line.split(" pid=")[0] for line in ran] == ["lookup Oslo"]
    assert primed["replies"] == cold["replies"]
    assert primed["replies"] == ["you said: hello (1 messages so far)", "lookup: sunny in Oslo"]
