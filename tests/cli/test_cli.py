"""The ``shadowpod`` command, run as a real process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shadowpod import __version__
from tests.conftest import default_sigint, postgres_unavailable


def shadowpod(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shadowpod", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_version() -> None:
    result = shadowpod("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"shadowpod, version {__version__}"


def test_help_lists_the_subcommands() -> None:
    result = shadowpod("--help")
    assert result.returncode == 0
    assert "bench" in result.stdout


def test_an_unknown_option_is_a_usage_error() -> None:
    result = shadowpod("bench", "journal", "--backend", "mongodb")
    assert result.returncode == 2
    assert "'mongodb' is not one of 'sqlite', 'postgres', 'both'" in result.stderr


REQUIRED_KEYS = {
    "backend",
    "appends_per_s",
    "append_latency_ms",
    "follow_latency_ms",
    "replay_entries_per_s",
    "turn_cost_ms_p50_by_length",
    "bytes_per_entry",
}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_bench_journal_prints_one_json_object_with_the_figures(backend: str) -> None:
    if backend == "postgres" and (reason := postgres_unavailable()):
        pytest.skip(reason)
    result = shadowpod("bench", "journal", "--quick", "--json", "--backend", backend)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report.keys() >= REQUIRED_KEYS
    assert report["backend"] == backend
    assert set(report["append_latency_ms"]) == {"p50", "p99"}
    assert set(report["follow_latency_ms"]) == {"p50", "p99"}
    assert list(report["turn_cost_ms_p50_by_length"]) == ["10", "100", "1000"]
    assert report["appends_per_s"] > 0 and report["replay_entries_per_s"] > 0
    sizes = list(report["db_bytes_by_length"].values())
    assert sizes == sorted(sizes)  # the database grows as the session does
    assert_machine_described(report["machine"])


def test_bench_fanout_reports_posts_and_delivery_by_open_streams() -> None:
    result = shadowpod("bench", "fanout", "--quick", "--json", timeout=240)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [run["streams_held"] for run in report["runs"]] == ["stalled", "reading", "idle"]
    for run in report["runs"]:
        assert list(run["by_open_streams"]) == ["0", "5"]
        for level in run["by_open_streams"].values():
            # Every post accepted, and every one delivered to the owner.
            assert level["post_failures"] == 0
            assert level["posts"]["count"] == level["owner_delivery"]["count"] == 20
    assert_machine_described(report["machine"])


def test_bench_journal_measures_both_backends_side_by_side_in_one_report() -> None:
    if reason := postgres_unavailable():
        pytest.skip(reason)
    result = shadowpod("bench", "journal", "--quick", "--json", "--backend", "both")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report["backends"]) == {"sqlite", "postgres"}
    for name, backend_report in report["backends"].items():
        assert backend_report.keys() >= REQUIRED_KEYS and backend_report["backend"] == name
    side = report["side_by_side"]
    assert len(side["sqlite_rounds"]) == len(side["postgres_rounds"]) >= 1
    assert side["postgres_to_sqlite"] == round(
        side["postgres_appends_per_s"] / side["sqlite_appends_per_s"], 2
    )
    assert report["targets"]["postgres_to_sqlite_min"]["target"] == 0.5
    assert_machine_described(report["machine"])


def assert_machine_described(machine: dict[str, Any]) -> None:
    """Each report says how fast the machine was, before and after, and how busy."""
    loop = machine["python_loop_s"]
    assert loop["steps"] > 0 and loop["before"] > 0 and loop["after"] > 0
    assert machine["cpus"] >= 1
    if machine["cpu"] is not None:  # Linux
        assert 0 <= machine["cpu"]["busy_pct"] <= 100
        assert 0 <= machine["cpu"]["steal_pct"] <= 100


def test_bench_journal_says_why_it_cannot_reach_postgres() -> None:
    result = shadowpod(
        "bench",
        "journal",
        "--quick",
        "--backend",
        "postgres",
        "--dsn",
        "postgresql://127.0.0.1:1/x",
    )
    assert result.returncode == 2
    assert "could not run" in result.stderr and "cannot reach PostgreSQL" in result.stderr


def test_bench_migrate_with_criu_says_why_it_cannot_run_where_criu_cannot() -> None:
    from shadowpod.local.criu import criu_unavailable

    reason = criu_unavailable()
    if reason is None:
        pytest.skip("CRIU can run here: the benchmark would run (tests/image/test_criu.py)")
    result = shadowpod("bench", "migrate", "--strategy", "criu", "--memory-mb", "10")
    assert result.returncode == 2
    assert "could not run" in result.stderr and reason in result.stderr


def test_bench_migrate_prints_one_json_object_with_both_strategies() -> None:
    result = shadowpod(
        "bench", "migrate", "--quick", "--json", "--rate", "100", "--migrations", "2",
        "--sessions", "2", "--compare", "1",
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["strategy"], report["rate"]) == ("shadow", 100.0)
    assert [m["result"] for m in report["migrations"]] == ["Succeeded", "Succeeded"]
    assert all(
        set(m["phases_s"]) >= {"Restoring", "CatchingUp", "Fencing"} for m in report["migrations"]
    )
    summary = report["summary"]
    for figure in (
        "total_s",
        "fence_pause_ms",
        "client_max_latency_ms",
        "client_max_latency_quiet_ms",
    ):
        assert set(summary[figure]) == {"p50", "p99"}
    assert (summary["lost"], summary["duplicated"], summary["reordered"]) == (0, 0, 0)
    assert all(check["ok"] for check in summary["checks"]), summary["checks"]
    replay = summary["replay"]  # a shadow replaying from the session's oldest snapshot
    assert replay["entries"] > 0 and summary["catchup_entries_per_s"] == replay["entries_per_s"] > 0
    # ... three times (it varies run to run): the figure is the median round.
    assert len(replay["rounds_entries_per_s"]) == 3
    assert replay["entries_per_s"] == sorted(replay["rounds_entries_per_s"])[1]
    # ... and again once the load has stopped, from the same snapshot, further.
    idle = summary["replay_uncontended"]
    assert idle["from_watermark"] == replay["from_watermark"]
    assert idle["entries"] >= replay["entries"] and idle["entries_per_s"] > 0
    assert report["comparison"]["strategy"] == "restart"
    assert report["comparison"]["summary"]["succeeded"] == 1
    assert summary["client_pause_restart_over_shadow"] > 0
    assert set(report["targets"]) >= {"fence_pause_ms_p99", "total_s_p50", "invariants"}
    assert set(report["targets"]) >= {"catchup_entries_per_s"}
    # The client pause against stop-and-recreate is a goal: reported, not checked.
    assert set(report["goals"]) == {"pause_ratio_min"}
    assert report["goals"]["pause_ratio_min"]["target"] == 20.0
    assert "pause_ratio_min" not in report["targets"]
    assert_machine_described(report["machine"])


PARTS = ("source_turn_ms", "shadowpod_ms", "new_owner_turn_ms", "client_ms")


def test_bench_migrate_fence_probe_gives_every_migration_a_message_sent_at_its_fence() -> None:
    # 5 msg/s: a message arrives during a fence by chance only in a few migrations.
    result = shadowpod(
        "bench", "migrate", "--quick", "--json", "--rate", "5", "--sessions", "1",
        "--migrations", "3", "--compare", "0", "--fence-probe",
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["fence_probe"] is True
    probes = [m["fence_probe"] for m in report["migrations"]]
    assert all(p["reply_ms"] is not None and p["reply_ms"] > 0 for p in probes), probes
    summary = report["summary"]
    # Each is placed against the fence (when it lands, by a few ms, is the machine's).
    assert sum(summary["fence_probe_arrived"].values()) == 3
    for migration in report["migrations"]:
        probe = migration["fence_probe"]
        if probe["arrived"] == "held":  # the gateway measured a pause
            assert migration["fence_pause_ms"] is not None, migration
        # One the new owner answered has its pause split: the source's in-flight turn,
        # Shadowpod's own part, the new owner's turn, the client's; they add up to it
        # (a probe the source answered itself is the source's turn).
        split = probe["breakdown"]
        assert split is not None, migration
        assert all(split[part] >= 0 for part in PARTS[:3]), split
        assert sum(split[part] for part in PARTS) == pytest.approx(probe["reply_ms"], abs=0.1)
        if split["answered_by"] == "new owner":
            assert split["new_owner_turn_ms"] > 0, split
    assert summary["fence_probe_breakdown_ms"]["split"] == 3
    # The probes are messages of the load: sent, answered once, in order.
    assert summary["messages"]["sent"] == summary["messages"]["answered"]
    assert (summary["lost"], summary["duplicated"], summary["reordered"]) == (0, 0, 0)


def test_bench_migrate_gives_up_with_a_clear_error_when_the_machine_cannot_keep_up() -> None:
    # One session at 5000 msg/s: more turns a second than any owner takes, anywhere.
    result = shadowpod(
        "bench", "migrate", "--quick", "--json", "--rate", "5000", "--sessions", "1",
        "--migrations", "5", "--compare", "0", "--max-backlog", "1",
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "this machine does not keep up with the load" in result.stderr
    assert "lower --rate" in result.stderr
    assert "Traceback" not in result.stderr and "never retrieved" not in result.stderr
    assert result.stdout == ""


def _children(pid: int) -> set[int]:
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
            if int(fields["PPid"]) == pid:
                found.add(int(status.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0


def _start_demo(workdir: Path) -> tuple[subprocess.Popen[str], set[int]]:
    """A demo that runs long enough, and the processes it started (gateway, agent v1)."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "shadowpod", "demo", "--json", "--rate", "50",
         "--before", "30", "--workdir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    started: set[int] = set()
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        started |= _children(demo.pid)
    if len(started) < 2:
        demo.kill()
        raise AssertionError("the demo did not start its gateway and agent")
    return demo, started


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find child processes")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_stops_the_demo_and_the_processes_it_started(
    tmp_path: Path, signum: signal.Signals
) -> None:
    demo, started = _start_demo(tmp_path / "demo")
    try:
        demo.send_signal(signum)
        _, stderr = demo.communicate(timeout=60)
    finally:
        demo.kill()
    # 128 + the signal, as a shell reports it; not 1, which says an invariant broke.
    assert demo.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr
    if signum == signal.SIGINT:
        assert stderr.strip().splitlines()[-1] == (
            "interrupted: every process it started was stopped"
        )
    assert [pid for pid in started if _alive(pid)] == []


@pytest.mark.skipif(
    not Path("/proc").is_dir() or sys.platform != "linux",
    reason="needs Linux (the parent-death signal) and /proc",
)
def test_a_killed_demo_leaves_no_gateway_or_agent_running(tmp_path: Path) -> None:
    demo, started = _start_demo(tmp_path / "demo")
    demo.kill()  # SIGKILL: no clean-up of its own
    demo.communicate(timeout=10)
    deadline = time.monotonic() + 30
    while [pid for pid in started if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [pid for pid in started if _alive(pid)] == []
