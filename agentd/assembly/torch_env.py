"""torch's environment switches for an agent built in Python.

torch's ``LocalElasticAgent`` reads these itself, whoever builds it; so does agentd's
(``agentd run`` resolves the same variables as its flags' defaults).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from agentd.exceptions import field_error
from agentd.timer.settings import TIMER_FILE_ENV, WatchdogSettings

if TYPE_CHECKING:
    from agentd.health.settings import HealthSettings

HEALTH_PORT_ENV = "TORCHELASTIC_HEALTH_CHECK_PORT"
TORCHELASTIC_HEALTH_CHECK_PORT = HEALTH_PORT_ENV
TORCHELASTIC_ENABLE_FILE_TIMER = "TORCHELASTIC_ENABLE_FILE_TIMER"
TORCHELASTIC_TIMER_FILE = TIMER_FILE_ENV
TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT = "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT"


def watchdog_from_env() -> WatchdogSettings:
    """torch's switches for an agent built in Python: ``TORCHELASTIC_ENABLE_FILE_TIMER=1``
    serves the named-pipe timers at ``TORCHELASTIC_TIMER_FILE`` (a private pipe if unset;
    the workers get its path in that variable)."""
    if os.environ.get(TORCHELASTIC_ENABLE_FILE_TIMER) != "1":
        return WatchdogSettings()
    return WatchdogSettings(file_timer=True, timer_file=os.environ.get(TIMER_FILE_ENV) or None)


def health_from_env() -> HealthSettings:
    """``TORCHELASTIC_HEALTH_CHECK_PORT``: serve the health endpoint there, as torch's; a
    port already taken (a second agent on the host) leaves the job without an endpoint,
    with a warning, where torch's server does nothing at all."""
    from agentd.health.settings import HealthSettings

    value = os.environ[HEALTH_PORT_ENV]
    if not value.isdigit() or int(value) > 65535:
        raise field_error(HEALTH_PORT_ENV, value, "must be a port number within 0..65535")
    return HealthSettings(port=int(value), required=False)
