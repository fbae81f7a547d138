"""Lightning's private part: the notifier its trainer registers for SIGTERM."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def sigterm_without_broadcast(trainer: Any) -> bool:
    """Have ``trainer`` register, for SIGTERM, a notifier that does what Lightning's does
    (log, ask its launcher to kill, set ``received_sigterm``) but no collective: Lightning
    2.6's broadcasts from within the handler, wherever the rank happens to be. Call before
    Lightning registers its handlers (a callback's ``setup``); its own broadcast at the
    next batch still tells every rank. False, and nothing changed, where the trainer has
    no such notifier (the connector's ``_sigterm_notifier_fn``)."""
    connector = getattr(trainer, "_signal_connector", None)
    if connector is None or not hasattr(connector, "_sigterm_notifier_fn"):
        return False

    def notify(signum: int, frame: Any) -> None:
        log.info("[rank %s] Received SIGTERM: %s", getattr(trainer, "local_rank", "?"), signum)
        if not connector.received_sigterm:
            launcher = getattr(trainer.strategy, "launcher", None)
            if launcher is not None:
                launcher.kill(signum)
        connector.received_sigterm = True

    connector._sigterm_notifier_fn = notify
    return True
