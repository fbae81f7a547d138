"""Hang detection from progress heartbeats: the agent side of :mod:`agentd.heartbeats.client`.

:mod:`~agentd.heartbeats.timeouts` holds the flags' and the learned timeouts,
:mod:`~agentd.heartbeats.monitor` each worker's deadline, :mod:`~agentd.heartbeats.stacks`
the stack dumps, :mod:`~agentd.heartbeats.verdict` who hung first, and
:mod:`~agentd.heartbeats.stragglers` the step times. :mod:`agentd.heartbeats.service`
runs them for the agent.
"""

from __future__ import annotations

import signal

DUMP_SIGNAL = signal.SIGRTMIN + 5
"""The signal a heartbeating worker registers faulthandler on: a real-time signal, which
no training library uses (SIGUSR1 is SLURM's and Lightning's requeue signal)."""
