"""The machine probe every benchmark report carries: core speed and how busy it was."""

from __future__ import annotations

from pathlib import Path

from shadowpod.bench.machine import CpuTimes, python_loop_s


def _stat(tmp_path: Path, user: int, idle: int, steal: int) -> Path:
    path = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    path.write_text(f"cpu  {user} 0 10 {idle} 5 0 5 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n")
    return path


def test_busy_and_steal_shares_over_the_run(tmp_path: Path) -> None:
    before = CpuTimes.read(_stat(tmp_path, user=100, idle=1000, steal=0))
    after = CpuTimes.read(_stat(tmp_path, user=400, idle=1500, steal=100))
    assert before is not None and after is not None
    # 900 ticks passed: 300 user (busy), 500 idle, 100 stolen by other guests.
    assert after.since(before) == {"busy_pct": 33.3, "steal_pct": 11.1}
    assert after.since(after) is None  # no time passed: no share to give


def test_no_proc_stat_no_cpu_figures(tmp_path: Path) -> None:
    assert CpuTimes.read(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert CpuTimes.read(tmp_path / "odd") is None


def test_the_loop_time_grows_with_its_steps() -> None:
    assert 0 < python_loop_s(1_000, rounds=1) < python_loop_s(2_000_000, rounds=1)
