"""The invariants a live scenario checks at the end, from the client's side and from
the journal.

A check fails only when its property fails. A run that gives nothing to judge a
property by — no reply from a new version yet, a new owner restarted after the
cutover (a recovery: it holds no promoted state to compare) — says so in the detail
and is marked ``measured=False``; it is not reported as a broken invariant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import ControlEvent, EntryKind, ProcessOp, ScheduleOp
from shadowpod.local.load import UNKNOWN_VERSION, ClientLoad, Verdict
from shadowpod.local.outcome import MigrationOutcome
from shadowpod.stats import percentile


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    # False when the run gave nothing to judge the property by: reported, not failed.
    measured: bool = True


def session_checks(
    migrations: Sequence[MigrationOutcome],
    load: ClientLoad,
    journal: list[JournalEntry],
    *,
    name: str | None = None,
    remembers: str | None = None,
    first_version: str = "1",
) -> list[Check]:
    """One session's invariants after its ``migrations`` under ``load``.

    ``remembers``: a text every reply from a version after ``first_version`` must
    carry (what the first version was told); ``name``, for the reference agent: the
    name v1 learned, which every later version greets (``hi <name>``)."""
    if remembers is None and name is not None:
        remembers = f"hi {name}"
    verdict = load.verdict()
    succeeded = [m for m in migrations if m.succeeded]
    return [
        _lost(verdict),
        Check(
            "duplicated",
            verdict.duplicated == 0,
            f"{verdict.duplicated} messages answered more than once",
        ),
        Check("reordered", verdict.reordered == 0, f"{verdict.reordered} replies out of order"),
        _one_version_per_reply(verdict, migrations),
        Check(
            "migrations succeeded",
            len(succeeded) == len(migrations),
            f"{len(succeeded)} of {len(migrations)} succeeded",
            measured=bool(migrations),
        ),
        _memory_kept(load, remembers, first_version),
        _state_at_fence(succeeded),
        _fenced_epochs_silent(journal),
        _schedules_fired_once(journal),
        # A source replaced after its death (a rollback's new owner) is checked too.
        _sources_drained(
            [m for m in migrations if m.succeeded or m.record.replacement is not None], journal
        ),
    ]


def _lost(verdict: Verdict) -> Check:
    detail = f"{verdict.lost} of {verdict.accepted} accepted messages got no reply"
    if verdict.unaccepted:
        # Not a loss (nothing was acknowledged), but a client saw it fail: say so.
        detail += f"; {verdict.unaccepted} never accepted (the gateway did not answer)"
    return Check("lost", verdict.lost == 0, detail)


def _one_version_per_reply(verdict: Verdict, migrations: Sequence[MigrationOutcome]) -> Check:
    name = "one version per reply"
    unversioned = verdict.versions.get(UNKNOWN_VERSION, 0)
    if unversioned:
        # Without it the client cannot tell which version answered: the check would
        # count no switch, and say ok, whatever happened.
        return Check(
            name,
            False,
            f"{unversioned} of {verdict.replied} replies carry no meta.version: the agent "
            "must say which version answered (turn.reply(text, version=agent.version))",
        )
    # Any migration that moved the epoch changed the owner — one that then failed too.
    moves = sum(m.moved for m in migrations)
    return Check(
        name,
        verdict.version_switches <= moves,
        f"versions changed {verdict.version_switches} times over {moves} owner changes",
    )


def replies_kept_up(load: ClientLoad, *, max_p99_s: float) -> Check:
    """The client's replies came within ``max_p99_s`` (p99): an agent slower than the
    rate it is sent answers every message, late and later; that is not a pass. Says
    the rate the agent sustained: replies over the time from the first message sent
    to the last reply (an agent behind works through its backlog without a pause)."""
    name = "replies kept up with the load"
    answered = load.answered()
    if not answered or not load.sent:
        return Check(name, False, "no message was answered")
    p99 = percentile([latency for _, latency in answered], 99)
    last_reply = max(sent_at + latency for sent_at, latency in answered)
    sustained = len(answered) / max(last_reply - load.sent[0].at, 1e-9)
    if p99 <= max_p99_s:
        return Check(
            name,
            True,
            f"p99 {p99 * 1000:.0f} ms (bound {max_p99_s:g} s); {load.rate:g} msg/s sent",
        )
    return Check(
        name,
        False,
        f"replies fell behind: p99 {p99:.1f} s (bound {max_p99_s:g} s); the agent answered "
        f"{sustained:.1f} msg/s while {load.rate:g} msg/s were sent — run it at --rate "
        f"{max(1, int(sustained * 0.8))} or make its turns faster",
    )


def _memory_kept(load: ClientLoad, remembers: str | None, first_version: str) -> Check:
    name = f"new versions answer with v{first_version}'s memory"
    if remembers is None:
        return Check(name, True, "not measured: no memory check given", measured=False)
    upgraded = [
        r.content
        for replies in load.replies.values()
        for r in replies
        if r.version != first_version
    ]
    kept = sum(remembers in content for content in upgraded)
    if not upgraded:
        return Check(
            name,
            True,
            f"not measured: no reply came from a version after v{first_version}",
            measured=False,
        )
    return Check(
        name,
        kept == len(upgraded),
        f"{kept} of {len(upgraded)} replies after the upgrade carry {remembers!r}",
    )


def _state_at_fence(succeeded: Sequence[MigrationOutcome]) -> Check:
    shadowed = [m for m in succeeded if m.record.spec.strategy != "restart"]
    compared = [m for m in shadowed if m.state_matches is not None]
    matched = sum(m.state_matches is True for m in compared)
    detail = f"{matched} of {len(compared)} promoted states matched the journal fold"
    restarted = sum(m.state_matches is None and m.record.recoveries > 0 for m in shadowed)
    silent = len(shadowed) - len(compared) - restarted
    if restarted:
        detail += (
            f"; {restarted} not compared: the new owner was restarted after the cutover "
            "(a recovery from the latest snapshot and the journal: no promoted state to compare)"
        )
    if silent:
        detail += f"; {silent} not compared: the new owner did not report its promoted state"
    return Check(
        "state at fence_seq equals the source's",
        matched == len(compared),
        detail,
        measured=bool(compared),
    )


def _fenced_epochs_silent(journal: list[JournalEntry]) -> Check:
    """No entry written at an epoch after a later epoch's marker: a replaced owner
    wrote nothing once fenced (inbound and gateway entries are epoch 0)."""
    current, changes, late = 0, 0, []
    for entry in journal:
        if entry.kind == EntryKind.CONTROL and entry.payload.get("event") == ControlEvent.EPOCH:
            changes += current > 0
            current = max(current, entry.epoch)
        elif 0 < entry.epoch < current:
            late.append(f"seq {entry.seq} ({entry.kind}) at epoch {entry.epoch} of {current}")
    detail = (
        f"{len(late)} writes of a replaced owner after its fence"
        + (f": {', '.join(late[:5])}" if late else "")
        + f" ({changes} owner changes)"
    )
    return Check(
        "no write of a fenced epoch after its fence", not late, detail, measured=changes > 0
    )


def _schedules_fired_once(journal: list[JournalEntry]) -> Check:
    fires = [
        (e.payload["schedule_id"], e.payload.get("fire_no"))
        for e in journal
        if e.kind == EntryKind.SCHEDULE and e.payload.get("op") == ScheduleOp.FIRE
    ]
    return Check(
        "schedules fired exactly once",
        len(fires) == len(set(fires)),
        f"{len(fires)} fires, {len(set(fires))} distinct",
        measured=bool(fires),
    )


def _sources_drained(succeeded: Sequence[MigrationOutcome], journal: list[JournalEntry]) -> Check:
    """Each replaced owner stopped its background processes: it reported its drain, or
    it died (killed, crashed) and none of the processes it started is still running."""
    reported = {
        e.payload.get("owner")
        for e in journal
        if e.kind == EntryKind.CONTROL and e.payload.get("event") == ControlEvent.DRAINED
    }
    drained, exits, failures = 0, [], []
    for outcome in succeeded:
        source = outcome.record.spec.source.name
        left = _still_running(journal, outcome.record.source_epoch)
        if left:
            failures.append(f"{source} left {', '.join(left)} running")
        elif source in reported:
            drained += 1
        elif outcome.source_exit is not None:
            exits.append(str(outcome.source_exit))
        else:
            failures.append(f"{source} is still running and never reported a drain")
    detail = f"{drained} of {len(succeeded)} replaced owners reported their drain"
    if exits:
        detail += (
            f"; {len(exits)} exited without reporting it (exit code {', '.join(exits)}: "
            "killed or crashed) and left no background process running"
        )
    if failures:
        detail += "; " + "; ".join(failures)
    return Check("sources drained", not failures, detail, measured=bool(succeeded))


def _still_running(journal: list[JournalEntry], epoch: int | None) -> list[str]:
    """Background processes the owner at ``epoch`` started that still run, as
    ``name (pid N)``."""
    if epoch is None:
        return []
    return [
        f"{e.payload['name']} (pid {e.payload['pid']})"
        for e in journal
        if e.kind == EntryKind.PROCESS
        and e.epoch == epoch
        and e.payload.get("op") == ProcessOp.STARTED
        and isinstance(e.payload.get("pid"), int)
        and _running(e.payload["pid"], e.payload.get("command") or [])
    ]


def _running(pid: int, command: list[str]) -> bool:
    """Whether ``pid`` is a live (not zombie) process running ``command`` — the
    command, because a pid may have been reused since. Without /proc: unknown, so no."""
    proc = Path("/proc") / str(pid)
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    if stat[stat.rindex(")") + 2 :].startswith("Z"):
        return False
    return not command or cmdline.rstrip(b"\0").split(b"\0") == [c.encode() for c in command]


def merge(name: str, checks: list[Check], sessions: int) -> Check:
    """One check across sessions: ok when it holds in every one."""
    if sessions == 1:
        return checks[0]
    failing = [c.detail for c in checks if not c.ok]
    measured = any(c.measured for c in checks)
    if failing:
        detail = "; ".join(failing)
    elif measured:
        detail = f"holds in all {sessions} sessions"
    else:
        detail = f"not measured in any of the {sessions} sessions"
    return Check(name, not failing, detail, measured=measured)
