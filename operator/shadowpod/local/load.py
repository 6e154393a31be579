"""Client load, and the invariants checked from the client's side of the gateway.

``ClientLoad`` posts messages at a steady rate (each with its own idempotency id,
retried with the same id when the gateway does not answer) and watches the replies
on the event stream. ``verdict()`` then says, for the messages it sent: how many the
gateway never accepted, how many accepted ones got no reply (lost), more than one
(duplicated), first replies out of order (reordered), which versions answered, and
the latencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import aiohttp

from shadowpod.client.gateway import GatewayClient, GatewayError
from shadowpod.stats import percentile

# The version of a reply whose meta names none.
UNKNOWN_VERSION: Final = "?"

RETRY_S: Final = 0.05
GIVE_UP_S: Final = 60.0
EXTRA_BASE: Final = 1_000_000  # the numbers of messages outside the steady rate


@dataclass
class Sent:
    n: int
    id: str
    at: float
    seq: int | None = None
    # The gateway did not accept it within ``GIVE_UP_S``: no reply is owed.
    given_up: bool = False


@dataclass
class Reply:
    turn: int
    seq: int
    content: str
    version: str
    at: float


@dataclass
class Verdict:
    sent: int
    accepted: int
    replied: int
    # Accepted (202: durable) and never answered. A message the gateway never accepted
    # (it did not answer for ``GIVE_UP_S``) was not lost by it: that is ``sent - accepted``.
    lost: int
    duplicated: int
    # First replies that came after the first reply to a later message. A second reply
    # is counted as duplicated only, not again as out of order.
    reordered: int
    versions: dict[str, int]
    version_switches: int
    latency_ms: dict[str, float]
    unanswered_ids: list[str] = field(default_factory=list)

    @property
    def unaccepted(self) -> int:
        return self.sent - self.accepted


class ClientLoad:
    def __init__(
        self,
        client: GatewayClient,
        session: str,
        rate: float,
        *,
        prefix: str = "load",
        message: Callable[[int], str] | None = None,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.message = message or (lambda n: f"message {n}")
        self.client = client
        self.session = session
        self.rate = rate
        self.prefix = prefix
        self.sent: list[Sent] = []
        self.by_seq: dict[int, Sent] = {}
        self.replies: dict[int, list[Reply]] = {}
        self.reply_order: list[int] = []
        self.other_replies: list[Reply] = []
        self._last_seen = 0
        self._failures = 0
        self._first_open = 0  # index in ``sent`` of the oldest message without a reply
        self._extras = 0

    # --- sending ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Send at ``rate`` until ``stop`` is set; then wait for every send to be accepted."""
        loop = asyncio.get_running_loop()
        interval = 1.0 / self.rate
        due = loop.time()
        tasks: set[asyncio.Task[None]] = set()
        n = 0
        try:
            while not stop.is_set():
                message = Sent(n=n, id=f"{self.prefix}-{n}", at=time.monotonic())
                self.sent.append(message)
                task = asyncio.create_task(self._send(message))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
                due += interval
                delay = due - loop.time()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=delay)
            if tasks:
                await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            # Abandoned (the scenario is torn down): sends in flight go with it, before
            # the client they use is closed.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def extra(self, label: str) -> Sent:
        """A message outside the steady rate (a probe), sent now with ``send``; it is
        one of the load's messages, judged as the others."""
        self._extras += 1
        message = Sent(
            n=EXTRA_BASE + self._extras,
            id=f"{self.prefix}-{label}-{self._extras}",
            at=time.monotonic(),
        )
        self.sent.append(message)
        return message

    async def send(self, message: Sent) -> None:
        await self._send(message)

    async def _send(self, message: Sent) -> None:
        deadline = time.monotonic() + GIVE_UP_S
        while True:
            try:
                accepted = await self.client.post_message(
                    self.session, self.message(message.n), id=message.id
                )
            except (aiohttp.ClientError, TimeoutError, GatewayError) as exc:
                if isinstance(exc, GatewayError) and exc.status < 500:
                    raise
                self._failures += 1
                if time.monotonic() > deadline:
                    message.given_up = True  # counted as never accepted
                    return
                await asyncio.sleep(RETRY_S)
                continue
            message.seq = accepted.seq
            self.by_seq[accepted.seq] = message
            return

    # --- watching ---------------------------------------------------------------------

    async def watch(self) -> None:
        """Collect assistant replies from the event stream (resuming after any drop)."""
        while True:
            try:
                async for batch in self.client.event_stream(
                    self.session, after=self._last_seen, kinds=["message"]
                ):
                    now = time.monotonic()
                    for entry in batch:
                        self._last_seen = entry.seq
                        payload = entry.payload
                        turn = payload.get("turn")
                        if payload.get("role") != "assistant" or not isinstance(turn, int):
                            continue
                        meta = payload.get("meta") or {}
                        reply = Reply(
                            turn,
                            entry.seq,
                            str(payload.get("content", "")),
                            str(meta.get("version", UNKNOWN_VERSION)),
                            now,
                        )
                        self.replies.setdefault(turn, []).append(reply)
                        self.reply_order.append(turn)
            except GatewayError as exc:
                if exc.reason == "JournalTruncated":
                    # Retention removed processed entries behind the oldest kept
                    # snapshot: this load's replies are after them; go on from there.
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError, GatewayError):
                        status = await self.client.status(self.session)
                        self._last_seen = max(self._last_seen, status.truncated_through)
                        continue
                await asyncio.sleep(RETRY_S)
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(RETRY_S)

    async def wait_answered(self, timeout_s: float, *, sent_before: float | None = None) -> bool:
        """Until every accepted message has a reply, or no reply at all has come for
        ``timeout_s``: a session still working through its backlog is slow, not losing
        messages, so it is waited for as long as it answers.

        ``sent_before`` (a ``time.monotonic()``): only the messages sent before then,
        while the load goes on — and only replies to those count as progress, or one
        lost message would be waited for as long as newer ones are answered.
        """

        def owed() -> tuple[bool, int]:
            """(anything still owed, a figure that moves when a reply comes)"""
            if sent_before is None:
                return self.oldest_wait_s() > 0, len(self.reply_order)
            self.oldest_wait_s()  # moves past what is answered, for ``unanswered``
            still = len(self.unanswered(sent_before, accepted_only=False))
            return still > 0, still

        waiting, seen = owed()
        progress_at = time.monotonic()
        while waiting:
            await asyncio.sleep(0.05)
            waiting, now = owed()
            if now != seen:
                seen, progress_at = now, time.monotonic()
            elif waiting and time.monotonic() - progress_at > timeout_s:
                return False
        return True

    def oldest_wait_s(self) -> float:
        """How long the oldest message still without a reply has waited (0: none)."""
        while self._first_open < len(self.sent):
            oldest = self.sent[self._first_open]
            if not oldest.given_up and (oldest.seq is None or oldest.seq not in self.replies):
                return time.monotonic() - oldest.at
            self._first_open += 1
        return 0.0

    # --- judging ----------------------------------------------------------------------

    def unanswered(self, sent_before: float, *, accepted_only: bool = True) -> list[Sent]:
        """Messages sent before ``sent_before`` (``time.monotonic()``) with no reply:
        accepted ones (lost, once the session has answered all it will), or also those
        still being retried (``accepted_only=False``; given up ones are not owed)."""
        found = []
        for message in itertools.islice(self.sent, self._first_open, None):
            if message.at >= sent_before:
                break
            if message.seq is None:
                if not accepted_only and not message.given_up:
                    found.append(message)
            elif message.seq not in self.replies:
                found.append(message)
        return found

    def answered(self) -> list[tuple[float, float]]:
        """(sent at, seconds to the first reply) for every answered message, in order."""
        return [
            (s.at, self.replies[s.seq][0].at - s.at)
            for s in self.sent
            if s.seq is not None and s.seq in self.replies
        ]

    def latencies(self, window: Callable[[Sent], bool] | None = None) -> list[float]:
        """Seconds from sending to the first reply, for answered messages in ``window``."""
        return [
            self.replies[s.seq][0].at - s.at
            for s in self.sent
            if s.seq is not None and s.seq in self.replies and (window is None or window(s))
        ]

    def verdict(self) -> Verdict:
        mine = [s for s in self.sent if s.seq is not None]
        replied = [s for s in mine if s.seq in self.replies]
        duplicated = sum(
            1 for s in mine if s.seq is not None and len(self.replies.get(s.seq, [])) > 1
        )
        firsts = list(dict.fromkeys(turn for turn in self.reply_order if turn in self.by_seq))
        reordered = sum(1 for before, after in itertools.pairwise(firsts) if after < before)
        versions = [self.replies[turn][0].version for turn in sorted(firsts)]
        switches = sum(1 for before, after in itertools.pairwise(versions) if before != after)
        latencies = self.latencies()
        return Verdict(
            sent=len(self.sent),
            accepted=len(mine),
            replied=len(replied),
            lost=len(mine) - len(replied),
            duplicated=duplicated,
            reordered=reordered,
            versions=dict(Counter(versions)),
            version_switches=switches,
            latency_ms={
                "p50": round(percentile(latencies, 50) * 1000, 2),
                "p99": round(percentile(latencies, 99) * 1000, 2),
                "max": round(max(latencies, default=0.0) * 1000, 2),
            },
            # Not ``s not in replied``: a list scan per message made this quadratic (two
            # minutes for 16,000 messages).
            unanswered_ids=list(
                itertools.islice(
                    (s.id for s in self.sent if s.seq is None or s.seq not in self.replies), 20
                )
            ),
        )
