"""Figures of a live scenario combined across sessions: the client-side verdict, p50
and p99 summaries, and the load's own latency jitter away from migrations."""

from __future__ import annotations

from collections.abc import Sequence

from shadowpod.local.load import ClientLoad, Verdict
from shadowpod.stats import percentile


def combine(loads: list[ClientLoad]) -> Verdict:
    """The client-side verdict over several sessions' loads."""
    verdicts = [load.verdict() for load in loads]
    latencies = [latency for load in loads for latency in load.latencies()]
    versions: dict[str, int] = {}
    for v in verdicts:
        for version, count in v.versions.items():
            versions[version] = versions.get(version, 0) + count
    return Verdict(
        sent=sum(v.sent for v in verdicts),
        accepted=sum(v.accepted for v in verdicts),
        replied=sum(v.replied for v in verdicts),
        lost=sum(v.lost for v in verdicts),
        duplicated=sum(v.duplicated for v in verdicts),
        reordered=sum(v.reordered for v in verdicts),
        versions=versions,
        version_switches=sum(v.version_switches for v in verdicts),
        latency_ms={
            "p50": round(percentile(latencies, 50) * 1000, 2),
            "p99": round(percentile(latencies, 99) * 1000, 2),
            "max": round(max(latencies, default=0.0) * 1000, 2),
        },
        unanswered_ids=[i for v in verdicts for i in v.unanswered_ids][:20],
    )


def summarise(values: list[float]) -> dict[str, float | None]:
    clean = [v for v in values if v is not None]
    if not clean:
        return {"p50": None, "p99": None}
    return {"p50": round(percentile(clean, 50), 3), "p99": round(percentile(clean, 99), 3)}


def quiet_latency_maxima(
    loads: Sequence[ClientLoad],
    busy: Sequence[tuple[float, float]],
    length_s: float,
    *,
    settle_s: float = 1.0,
) -> list[float]:
    """Each session's worst reply latency (seconds) in windows of ``length_s`` that
    overlap no ``busy`` interval (the migrations, of any session), nor the ``settle_s``
    after one — an old process exits and a warm spare starts then. Windows lie between
    the first busy interval and the end of the last one.

    This is the load's own jitter: a migration's worst latency set against it tells
    what the migration added, where the raw figure also holds whatever the two cores
    were doing anyway.
    """
    if not busy or length_s <= 0:
        return []
    blocked = sorted((start, end + settle_s) for start, end in busy)
    span_start, span_end = blocked[0][0], max(end for _, end in busy)
    maxima = []
    for load in loads:
        answered = load.answered()
        at = span_start
        while at + length_s <= span_end:
            end = at + length_s
            clash = next((b for b in blocked if b[0] < end and at < b[1]), None)
            if clash is not None:
                at = clash[1]
                continue
            inside = [latency for sent, latency in answered if at <= sent < end]
            if inside:
                maxima.append(max(inside))
            at = end
    return maxima
