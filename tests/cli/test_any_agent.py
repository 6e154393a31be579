"""``shadowpod demo`` takes any agent: ``--images map.yaml --from A --to B``, its
messages, its opening and its memory check. Here the LangGraph example, whose image
map declares no schema versions (its code says them)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.cli.test_cli import shadowpod

EXAMPLE = Path(__file__).parents[2] / "examples" / "03-langgraph" / "agent.py"


def _map(tmp_path: Path) -> Path:
    images = {
        f"lg:v{v}": {
            "command": ["{python}", str(EXAMPLE), "--version", str(v)],
            "env": {"TOOL_LOG": "{here}/tools.log"},
        }
        for v in (1, 2)
    }
    path = tmp_path / "images.yaml"
    path.write_text(yaml.safe_dump({"images": images}))
    return path


def test_the_demo_migrates_a_langgraph_agent_named_by_its_image_map(tmp_path: Path) -> None:
    # A rate the LangGraph example keeps up with on a busy core (it answered 14 msg/s
    # beside the suite's other workers): what is tested is the image map, not its speed.
    result = shadowpod(
        "demo", "--json", "--rate", "8", "--before", "1", "--after", "1",
        "--images", str(_map(tmp_path)), "--from", "lg:v1", "--to", "lg:v2",
        "--seed", "hello", "--seed", "lookup Oslo",
        "--message", "tell me {n}", "--remembers", "messages so far",
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"], report["checks"]
    assert [m["result"] for m in report["migrations"]] == ["Succeeded"]
    assert set(report["messages"]["by_version"]) == {"1", "2"}
    assert report["invariants"] == {"lost": 0, "duplicated": 0, "reordered": 0}
    memory = next(c for c in report["checks"] if c["name"].startswith("new versions answer"))
    assert memory["ok"] and memory["measured"], memory


def test_an_image_map_without_from_and_to_is_refused_saying_what_to_give(tmp_path: Path) -> None:
    result = shadowpod("demo", "--images", str(_map(tmp_path)), "--from", "lg:v1", timeout=30)
    assert result.returncode == 2
    assert "--images needs --from (the image to start) and --to" in result.stderr


def test_an_image_not_in_the_map_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    result = shadowpod(
        "demo", "--images", str(_map(tmp_path)), "--from", "lg:v1", "--to", "lg:v9", timeout=30
    )
    assert result.returncode == 2
    assert "'lg:v9' is not in the local image map (known: lg:v1, lg:v2)" in result.stderr


def test_bench_langgraph_compares_the_two_checkpointers_in_one_json_object() -> None:
    result = shadowpod("bench", "langgraph", "--quick", "--json", timeout=180)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    ours = report["savers"]["shadowpod"]["by_turns"]
    theirs = report["savers"]["langgraph_sqlite"]["by_turns"]
    assert set(ours) == set(theirs) == {"10", "100"}
    # Shadowpod's write per turn stays flat; the SQLite saver's grows with the history.
    assert report["targets"]["shadowpod_turn_bytes_flat"]["met"] is True
    assert theirs["100"]["one_more_turn_bytes"] > 3 * theirs["10"]["one_more_turn_bytes"]
    assert theirs["100"]["bytes_stored"] > 5 * ours["100"]["bytes_stored"]
    assert report["targets"]["turn_bytes_cheaper_at_1000"]["met"] is None  # not run
    # Tool-calling turns: the prebuilt agents on Shadowpod, side by side with the
    # DeltaChannel graph on LangGraph's own SQLite saver.
    tools = report["tool_turns"]
    assert set(tools) == {
        "shadowpod_create_react_agent",
        "shadowpod_create_agent",
        "shadowpod_custom_graph",
        "langgraph_sqlite_delta_channel",
    }
    assert all(set(column["by_turns"]) == {"10", "100"} for column in tools.values())
    react = tools["shadowpod_create_react_agent"]["by_turns"]
    assert react["100"]["one_more_turn_bytes"] < 2 * react["10"]["one_more_turn_bytes"]
    assert report["targets"]["tool_turn_bytes_vs_delta_channel"]["at_turns"] == 100
    assert report["machine"]["cpus"] >= 1
