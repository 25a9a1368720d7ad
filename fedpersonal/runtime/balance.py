"""Shares of a group round that follow the engine workers' measured speeds (`EngineWorkers(balance=True)`).

A round waits for its slowest share. With equal shares, one worker 10-30% slower than the other (another
machine, or a core that other work shares) makes every round that much slower; docs/ENGINE.md, "Engine workers",
measured such splits on this project's 2-core host. `GroupBalancer` instead gives each worker a number of whole
groups chosen so that the slowest worker's predicted seconds are as small as they can be, with each worker's speed
taken from its last rounds.

The shares stay contiguous and in worker order, so which worker trains a client changes only where the sums of the
shares' updates are split: a balanced round equals an even one to float reassociation, not bit for bit. That is
why balancing is an option (``--engine_workers_balance``) and not the default: the same seed gives the same
numbers only with a fixed split.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Sequence

_RECENT = 5  # Rounds whose seconds per group make a worker's estimate (their median).
_GAIN = 0.03  # A new split is taken only when it is predicted to be at least this much faster.


def fastest_counts(groups: int, seconds_per_group: Sequence[float]) -> list[int]:
    """Groups per worker that minimize the slowest worker's ``count * seconds_per_group`` (groups given out one at a
    time, each to the worker that would finish it first; optimal for equal groups; ties to the lower worker).

    >>> fastest_counts(10, [1.0, 1.0])
    [5, 5]
    >>> fastest_counts(10, [1.0, 1.5])
    [6, 4]
    >>> fastest_counts(3, [1.0, 10.0])
    [3, 0]
    """
    counts = [0] * len(seconds_per_group)
    queue = [(s, w) for w, s in enumerate(seconds_per_group)]
    heapq.heapify(queue)
    for _ in range(groups):
        finish, w = heapq.heappop(queue)
        counts[w] += 1
        heapq.heappush(queue, (finish + seconds_per_group[w], w))
    return counts


def slices(num_clients: int, group_size: int, counts: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` client slices, one per worker in order, of ``counts[w]`` whole groups each (the
    last group may be partial; a worker with no group gets an empty slice).

    >>> slices(95, 10, [6, 4])
    [(0, 60), (60, 95)]
    >>> slices(30, 10, [0, 3])
    [(0, 0), (0, 30)]
    """
    bounds, start = [], 0
    for count in counts:
        stop = min(start + count * group_size, num_clients)
        bounds.append((start, stop))
        start = stop
    return bounds


class GroupBalancer:
    """Each worker's recent seconds per group, and the split of a round's groups they predict to be fastest.

    Args:
      workers: How many workers.

    Attributes:
      seconds_per_group: Each worker's last rounds' seconds per group (at most five; a worker given no group keeps
        its last ones).
    """

    def __init__(self, workers: int):
        self.seconds_per_group: list[collections.deque[float]] = [
            collections.deque(maxlen=_RECENT) for _ in range(workers)
        ]

    def estimates(self) -> list[float] | None:
        """Each worker's median seconds per group, None until every worker has been measured."""
        if not all(self.seconds_per_group):
            return None
        return [sorted(s)[len(s) // 2] for s in self.seconds_per_group]

    def counts(self, groups: int, even: Sequence[int], current: Sequence[int] | None = None) -> list[int]:
        """Groups per worker for a round of `groups` groups: `even` (the equal split) until every worker is
        measured; then the fastest split by the estimates (`fastest_counts`), kept only when it is predicted at
        least 3% faster than `current` (the last round's split when it had as many groups, else `even`), so that
        noise in the measurements does not move clients back and forth."""
        estimates = self.estimates()
        if estimates is None:
            return list(even)
        baseline = list(current) if current is not None and sum(current) == groups else list(even)
        best = fastest_counts(groups, estimates)
        predicted = lambda counts: max(c * s for c, s in zip(counts, estimates))
        return best if predicted(best) < (1.0 - _GAIN) * predicted(baseline) else baseline

    def record(self, counts: Sequence[int], seconds: Sequence[float]) -> None:
        """A round's measured seconds of every worker that had groups (`seconds`, in worker order), given how many
        groups each worker had."""
        busy = [w for w, c in enumerate(counts) if c]
        for w, s in zip(busy, seconds):
            self.seconds_per_group[w].append(s / counts[w])
