"""Hang detection from progress heartbeats: the agent side of :mod:`agentd.heartbeats.client`.

:mod:`~agentd.heartbeats.timeouts` holds the flags' and the learned timeouts,
:mod:`~agentd.heartbeats.monitor` each worker's deadline, :mod:`~agentd.heartbeats.stacks`
the stack dumps, :mod:`~agentd.heartbeats.verdict` who hung first, and
:mod:`~agentd.heartbeats.stragglers` the step times. :mod:`agentd.heartbeats.service`
runs them for the agent.
"""

from __future__ import annotations

from agentd.wire.progress import DUMP_SIGNAL

__all__ = ["DUMP_SIGNAL"]
