"""What a drain may do: its signals, its timeout, the workers' checkpoint signal."""

from __future__ import annotations

import signal
from typing import NamedTuple


class DrainSettings(NamedTuple):
    signals: tuple[signal.Signals, ...] = ()
    """Stop signals that drain this node instead of stopping it at once."""
    timeout: float = 60.0
    """Seconds the draining agent waits for every node's checkpoints before it leaves."""
    checkpoint_signal: signal.Signals | None = None
    """Also sent to every worker when a drain starts (for scripts that handle it)."""
