"""The invariants a live scenario checks at the end, from the client's side and from
the journal, and how figures are combined across sessions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import ControlEvent, EntryKind, ScheduleOp
from shadowpod.engine.record import Phase
from shadowpod.local.load import ClientLoad, Verdict
from shadowpod.stats import percentile

if TYPE_CHECKING:
    from shadowpod.local.scenario import MigrationOutcome


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def session_checks(
    migrations: Sequence[MigrationOutcome],
    load: ClientLoad,
    journal: list[JournalEntry],
    *,
    name: str,
) -> list[Check]:
    """One session's invariants after its ``migrations`` under ``load``; ``name`` is
    what v1 was told, which every later version must greet."""
    verdict = load.verdict()
    succeeded = [m for m in migrations if m.record.phase is Phase.SUCCEEDED]
    upgraded = [r.content for replies in load.replies.values() for r in replies if r.version != "1"]
    fires = [
        (e.payload["schedule_id"], e.payload.get("fire_no"))
        for e in journal
        if e.kind == EntryKind.SCHEDULE and e.payload.get("op") == ScheduleOp.FIRE
    ]
    drained = [
        e
        for e in journal
        if e.kind == EntryKind.CONTROL and e.payload.get("event") == ControlEvent.DRAINED
    ]
    matches = [m.state_matches for m in succeeded if m.record.spec.strategy == "shadow"]
    greeted = sum(f"hi {name}" in c for c in upgraded)
    return [
        Check("lost", verdict.lost == 0, f"{verdict.lost} of {verdict.sent} messages got no reply"),
        Check(
            "duplicated",
            verdict.duplicated == 0,
            f"{verdict.duplicated} messages answered more than once",
        ),
        Check("reordered", verdict.reordered == 0, f"{verdict.reordered} replies out of order"),
        Check(
            "one version per reply",
            verdict.version_switches <= len(succeeded),
            f"versions changed {verdict.version_switches} times over {len(succeeded)} migrations",
        ),
        Check(
            "migrations succeeded",
            len(succeeded) == len(migrations),
            f"{len(succeeded)} of {len(migrations)} succeeded",
        ),
        Check(
            "new versions answer with v1's memory",
            greeted == len(upgraded) and (bool(upgraded) or not succeeded),
            f"{greeted} of {len(upgraded)} replies after the upgrade greet the name v1 learned",
        ),
        Check(
            "state at fence_seq equals the source's",
            all(m is True for m in matches),
            f"{sum(m is True for m in matches)} of {len(matches)} migrations matched "
            "the journal fold",
        ),
        Check(
            "schedules fired exactly once",
            len(fires) == len(set(fires)),
            f"{len(fires)} fires, {len(set(fires))} distinct",
        ),
        Check(
            "sources drained",
            len(drained) >= len(succeeded),
            f"{len(drained)} drain reports for {len(succeeded)} replaced owners",
        ),
    ]


def merge(name: str, checks: list[Check], sessions: int) -> Check:
    """One check across sessions: ok when it holds in every one."""
    if sessions == 1:
        return checks[0]
    failing = [c.detail for c in checks if not c.ok]
    detail = "; ".join(failing) if failing else f"holds in all {sessions} sessions"
    return Check(name, not failing, detail)


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
