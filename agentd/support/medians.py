"""The median of every entry's *others*, for N entries in O(N log N) rather than O(N^2).

A node compared with the rest of the job (the straggler comparison, the job view's
ratio) is compared with the median of the other nodes. Removing one entry from a sorted
list leaves the rest in order, so that median is the entry at the middle of what is left,
or the mean of the two there: one sort, then a binary search per entry.
"""

from __future__ import annotations

import bisect


def median_of_others(ordered: list[float], value: float) -> float | None:
    """The median of ``ordered`` (sorted, holding ``value``) without one occurrence of
    ``value``, in O(log N); None when nothing is left."""
    rest = len(ordered) - 1
    if rest < 1:
        return None
    removed = bisect.bisect_left(ordered, value)

    def at(i: int) -> float:
        return ordered[i if i < removed else i + 1]

    if rest % 2:
        return at(rest // 2)
    return (at(rest // 2 - 1) + at(rest // 2)) / 2
