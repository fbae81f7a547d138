"""In-process restarts' settings (``--inprocess-park-timeout``,
``--inprocess-quick-restarts``), the reasons a rank falls back to a new process, and the
record of the last fallback: light enough for the command line and ``/status``."""

from __future__ import annotations

from typing import NamedTuple

QUICK_REPEATS = 3
QUICK_WINDOW = 60.0
"""After QUICK_REPEATS in-process restarts, each within QUICK_WINDOW seconds of the one
before, the next restart uses new processes: what the survivors kept may be what fails."""
PARK_TIMEOUT = 10.0
"""How long the survivors have to leave their training function (a collective in native
code returns first): one that has not by then is replaced by a new process, and the others
are kept."""

FALLBACK_REASONS = (
    "not_opted_in",
    "broken_channel",
    "park_timeout",
    "quick_repeats",
    "static_store",
)
"""Why a live, healthy rank was not kept: the first three replace those ranks alone, the
last two every rank (see :mod:`agentd.inprocess.service`). A rank whose process is on its
way out (its channel closed, or it exited while the others parked) is lost, not a
fallback."""
REPLACED_BECAUSE = {
    "not_opted_in": "never called agentd.inprocess.run",
    "channel_closed": "closed their in-process channel (their process is exiting)",
    "broken_channel": "broke the in-process protocol",
    "park_timeout": "did not park within {park_timeout:.1f}s",
    "exited_while_parking": "exited while the others parked",
}
"""What the log says of survivors replaced by new processes alone, by reason
(``{park_timeout}``: the bound, in seconds)."""


class InProcessSettings(NamedTuple):
    """How in-process restarts are bounded: ``park_timeout`` seconds for the survivors to
    park; after ``quick_repeats`` in-process restarts in a row, each within
    :data:`QUICK_WINDOW` of the last, the next uses new processes (0: no such limit)."""

    park_timeout: float = PARK_TIMEOUT
    quick_repeats: int = QUICK_REPEATS


class Fallback(NamedTuple):
    """The last restart that did not keep every survivor: why, the local ranks it
    concerned, and the local ranks kept anyway (empty: every rank was a new process)."""

    reason: str
    local_ranks: tuple[int, ...]
    kept: tuple[int, ...]
