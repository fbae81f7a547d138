"""torch's environment switches for an agent built in Python.

torch's ``LocalElasticAgent`` reads these itself, whoever builds it; so does agentd's
(``agentd run`` resolves the same variables as its flags' defaults).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

from agentd.exceptions import field_error
from agentd.timer.settings import TIMER_FILE_ENV, WatchdogSettings

if TYPE_CHECKING:
    from agentd.assembly.settings import AgentSettings
    from agentd.health.settings import HealthSettings

HEALTH_PORT_ENV = "TORCHELASTIC_HEALTH_CHECK_PORT"
TORCHELASTIC_HEALTH_CHECK_PORT = HEALTH_PORT_ENV
TORCHELASTIC_ENABLE_FILE_TIMER = "TORCHELASTIC_ENABLE_FILE_TIMER"
TORCHELASTIC_TIMER_FILE = TIMER_FILE_ENV
TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT = "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT"


class Stoppable(Protocol):
    """A health check server a caller hands torch's agent: the agent stops it at its end."""

    def stop(self) -> None: ...


def watchdog_from_env() -> WatchdogSettings:
    """torch's switches for an agent built in Python: ``TORCHELASTIC_ENABLE_FILE_TIMER=1``
    serves the named-pipe timers at ``TORCHELASTIC_TIMER_FILE`` (a private pipe if unset;
    the workers get its path in that variable); ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``
    reaps a worker that long in D state (0 or less: off, as torch's)."""
    stuck = _stuck_seconds(os.environ.get(TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, ""))
    if os.environ.get(TORCHELASTIC_ENABLE_FILE_TIMER) != "1":
        return WatchdogSettings(uninterruptible_timeout=stuck)
    timer_file = os.environ.get(TIMER_FILE_ENV) or None
    return WatchdogSettings(file_timer=True, timer_file=timer_file, uninterruptible_timeout=stuck)


def _stuck_seconds(value: str) -> float:
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        raise field_error(
            TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, value, "must be a number of seconds"
        ) from None


def with_torch_arguments(
    settings: AgentSettings,
    health_check_server: Stoppable | None,
    uninterruptible_state_timeout: float | None,
) -> AgentSettings:
    """``settings`` under torch's ``LocalElasticAgent`` arguments of the same names: an
    ``uninterruptible_state_timeout`` given wins over its variable (0 or less: off); a
    caller's ``health_check_server`` is the job's, so ``TORCHELASTIC_HEALTH_CHECK_PORT``
    starts no other (the agent stops it at its end, as torch's does)."""
    watchdog = settings.watchdog
    if watchdog is None:
        watchdog = watchdog_from_env() if settings.torch_env else WatchdogSettings()
    if uninterruptible_state_timeout is not None:
        stuck = max(0.0, float(uninterruptible_state_timeout))
        watchdog = watchdog._replace(uninterruptible_timeout=stuck)
    if health_check_server is None:
        return settings.replace(watchdog=watchdog)
    return settings.replace(watchdog=watchdog, torch_env=False)


def health_from_env() -> HealthSettings:
    """``TORCHELASTIC_HEALTH_CHECK_PORT``: serve the health endpoint there, as torch's; a
    port already taken (a second agent on the host) leaves the job without an endpoint,
    with a warning, where torch's server does nothing at all."""
    from agentd.health.settings import HealthSettings

    value = os.environ[HEALTH_PORT_ENV]
    if not value.isdigit() or int(value) > 65535:
        raise field_error(HEALTH_PORT_ENV, value, "must be a port number within 0..65535")
    return HealthSettings(port=int(value), required=False)
