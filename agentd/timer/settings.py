"""How the agent's watchdog is set up: the settings the agent and its config share."""

from __future__ import annotations

from typing import NamedTuple

TIMER_FILE_ENV = "TORCHELASTIC_TIMER_FILE"
"""Where a worker finds the pipe's path under ``--file-timer`` (torch's variable)."""


class WatchdogSettings(NamedTuple):
    """How the agent's watchdog is set up (``agentd run`` flags of the same names).

    ``file_timer`` serves torch's named-pipe protocol at ``timer_file`` (None: a private
    pipe); ``dump_signal`` (e.g. SIGUSR1 with ``faulthandler``) is sent ``dump_grace``
    seconds before the kill; ``uninterruptible_timeout`` > 0 reaps workers stuck that long
    in D state.
    """

    file_timer: bool = False
    timer_file: str | None = None
    dump_signal: int | None = None
    dump_grace: float = 1.0
    uninterruptible_timeout: float = 0.0
