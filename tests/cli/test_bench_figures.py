"""How the migration benchmark sets a migration's worst client latency against the
load's own jitter (windows of the same length with no migration running)."""

from __future__ import annotations

from typing import Any

import pytest

from shadowpod.bench.migrate import _check_targets
from shadowpod.cli.bench import _run_and_report
from shadowpod.client.gateway import GatewayClient
from shadowpod.local.figures import quiet_latency_maxima
from shadowpod.local.load import ClientLoad, Reply, Sent


def _load(latency_at: dict[float, float]) -> ClientLoad:
    """A session's load whose message sent at ``t`` was answered ``latency`` later."""
    load = ClientLoad(GatewayClient("http://127.0.0.1:9"), "s", rate=10)
    for n, (at, latency) in enumerate(sorted(latency_at.items()), start=1):
        load.sent.append(Sent(n=n, id=f"m{n}", at=at, seq=n))
        load.replies[n] = [Reply(turn=n, seq=n + 1000, content="ok", version="1", at=at + latency)]
    return load


def test_windows_skip_migrations_and_the_settling_after_them() -> None:
    # One message every 0.1 s from t=0 to t=9.9, 10 ms each, except a slow one inside
    # each migration (t=1.2, t=6.2) and one in the settling second after the first (2.4).
    latencies = {round(i * 0.1, 1): 0.010 for i in range(100)}
    latencies |= {1.2: 0.500, 6.2: 0.400, 2.4: 0.300, 4.3: 0.050}
    busy = [(1.0, 1.5), (6.0, 6.5)]

    maxima = quiet_latency_maxima([_load(latencies)], busy, length_s=0.5, settle_s=1.0)

    # Quiet span: 2.5 to 6.0 (after the first migration has settled, before the second).
    assert sorted(maxima) == pytest.approx([0.010] * 6 + [0.050])  # 4.3 was slow anyway


def test_no_migration_no_quiet_windows() -> None:
    assert quiet_latency_maxima([_load({0.0: 0.01})], [], length_s=0.5) == []


def test_every_session_gives_its_own_windows() -> None:
    calm = _load({round(i * 0.1, 1): 0.010 for i in range(60)})
    jittery = _load({round(i * 0.1, 1): 0.020 for i in range(60)})
    maxima = quiet_latency_maxima([calm, jittery], [(0.0, 0.5), (5.0, 5.5)], 1.0)
    assert sorted(maxima) == pytest.approx([0.010] * 3 + [0.020] * 3)


def _check_run(fence_pause_p99_ms: float | None) -> dict[str, Any]:
    """``bench migrate --check`` on a run whose figures meet every target but,
    perhaps, the fence pause; exits as the command would."""
    report: dict[str, Any] = {
        "summary": {
            "fence_pause_ms": {"p50": fence_pause_p99_ms, "p99": fence_pause_p99_ms},
            "total_s": {"p50": 0.4, "p99": 0.9},
            "catchup_entries_per_s": 60_000,
            "lost": 0,
            "duplicated": 0,
            "reordered": 0,
        }
    }
    report["targets"] = _check_targets(report)

    async def finished() -> dict[str, Any]:
        return report

    _run_and_report("migration", finished(), lambda _: None, as_json=True, check=True)
    return report


def test_a_run_where_no_fence_held_a_message_back_has_not_missed_the_pause_target() -> None:
    # Every fence closed between two turns and moved on before the next message: no
    # pause to measure. --check must not call that a miss (nothing exceeded 50 ms).
    report = _check_run(None)
    assert report["targets"]["fence_pause_ms_p99"]["met"] is None


def test_a_measured_pause_over_the_target_is_a_miss() -> None:
    with pytest.raises(SystemExit) as exited:
        _check_run(80.0)
    assert exited.value.code == 1
