"""The garbage collector paused for a bounded burst of allocations on the store's path."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No collection inside: for work that allocates a few objects per key of a store's
    state while every request waits on it (a hand-down: the host's snapshot and the
    successor's restore). The collections such a burst sets off scan the whole heap, and
    were a third of the hold (8,192 nodes: 426 against 275 ms,
    ``bench/bench_handdown.py``). Collection resumes as it was on the way out."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
