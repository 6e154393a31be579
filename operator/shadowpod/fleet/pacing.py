"""The cluster-wide pacing queue: which waiting migrations may run now.

Every migration — a rollout's, a node drain's, a user's — waits in ``Queued`` until this
admits it. At most ``max_concurrent`` migrations run at once in the cluster, at most
``max_per_node`` out of one source node (as KubeVirt's ``parallelMigrationsPerCluster``
and ``parallelOutboundMigrationsPerNode``): each move starts a shadow pod and reads a
snapshot, and a node that sends many at once starves its remaining owners.

The order is fair between the *groups* that asked (each rollout is one group, each
drained node one, each session's own moves one): the next free slot goes to the group
with the fewest migrations running, the oldest request first among equals. A rollout
with a thousand sessions queued therefore shares the slots with a drain of five rather
than running ahead of it, and within a group requests run in the order they came.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from shadowpod.fleet.strategy import MAX_CONCURRENCY, StrategyError

DEFAULT_MAX_CONCURRENT: Final = 10
DEFAULT_MAX_PER_NODE: Final = 2


@dataclass(frozen=True)
class Caps:
    """``--max-concurrent-migrations`` and ``--max-concurrent-migrations-per-node``."""

    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    max_per_node: int = DEFAULT_MAX_PER_NODE

    def __post_init__(self) -> None:
        if not 1 <= self.max_concurrent <= MAX_CONCURRENCY:
            raise StrategyError(
                f"--max-concurrent-migrations is {self.max_concurrent}: give 1 to {MAX_CONCURRENCY}"
            )
        if not 1 <= self.max_per_node <= self.max_concurrent:
            raise StrategyError(
                f"--max-concurrent-migrations-per-node is {self.max_per_node}: give 1 to"
                f" --max-concurrent-migrations ({self.max_concurrent})"
            )


def drain_group(node: str) -> str:
    return f"drain/{node}"


def rollout_group(namespace: str, deployment: str) -> str:
    return f"rollout/{namespace}/{deployment}"


def session_group(namespace: str, session: str) -> str:
    return f"session/{namespace}/{session}"


@dataclass(frozen=True)
class Request:
    """A migration in the queue or running. ``node`` is the source owner's node (None
    when unknown: it then counts against the cluster cap only); ``queued_at`` orders
    requests within a group and breaks ties between groups."""

    name: str
    group: str
    node: str | None
    queued_at: float
    running: bool = False


@dataclass(frozen=True)
class Admission:
    admit: tuple[str, ...]  # start these now
    # Every request still waiting, in the order it would run if the caps allowed: its
    # index is the position ``Queued`` shows.
    queue: tuple[str, ...]


def admit(requests: Sequence[Request], caps: Caps) -> Admission:
    running = [r for r in requests if r.running]
    total = len(running)
    per_node: Counter[str] = Counter(r.node for r in running if r.node is not None)
    per_group: Counter[str] = Counter(r.group for r in running)
    waiting: defaultdict[str, list[Request]] = defaultdict(list)
    for request in sorted(
        (r for r in requests if not r.running), key=lambda r: (r.queued_at, r.name)
    ):
        waiting[request.group].append(request)

    def fits(request: Request) -> bool:
        return request.node is None or per_node[request.node] < caps.max_per_node

    admitted: list[str] = []
    while total < caps.max_concurrent:
        # Each group's oldest request that its node has room for.
        heads = {
            group: next((r for r in queue if fits(r)), None) for group, queue in waiting.items()
        }
        ready = [(group, head) for group, head in heads.items() if head is not None]
        if not ready:
            break
        group, head = min(ready, key=lambda item: (per_group[item[0]], item[1].queued_at, item[0]))
        waiting[group].remove(head)
        admitted.append(head.name)
        total += 1
        per_group[group] += 1
        if head.node is not None:
            per_node[head.node] += 1

    return Admission(admit=tuple(admitted), queue=_order(waiting, per_group))


def _order(waiting: dict[str, list[Request]], per_group: Counter[str]) -> tuple[str, ...]:
    """The rest in the order the same rule would admit them with no cap: positions to
    show, not promises (a node's cap may let a later one overtake). A heap, because a
    thousand single-session groups are as likely as one group of a thousand."""
    heap = [
        (per_group[group], queue[0].queued_at, group, 0)
        for group, queue in waiting.items()
        if queue
    ]
    heapq.heapify(heap)
    order: list[str] = []
    while heap:
        served, _, group, index = heapq.heappop(heap)
        queue = waiting[group]
        order.append(queue[index].name)
        if index + 1 < len(queue):
            heapq.heappush(heap, (served + 1, queue[index + 1].queued_at, group, index + 1))
    return tuple(order)
