"""In-process restart: when one rank fails, the others keep their process and memory.

Wrap the training function (the objects it keeps, model and optimizer, live outside it)::

    import agentd.inprocess as inprocess

    def train():
        dist.init_process_group("gloo")      # env://, as under torchrun
        inprocess.sync(model)                 # a new rank gets a survivor's weights
        step = inprocess.sync_object(step)    # and its step
        ...

    inprocess.run(train)

See :mod:`agentd.inprocess.worker` for the worker's side and
:mod:`agentd.inprocess.service` for the agent's. Nothing here imports torch until
:func:`sync` or :func:`sync_object` runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.support.lazy import lazy_getattr

_EXPORTS = {
    "run": "agentd.inprocess.worker",
    "current": "agentd.inprocess.worker",
    "Restart": "agentd.inprocess.worker",
    "Interrupted": "agentd.inprocess.worker",
    "sync": "agentd.inprocess.state",
    "sync_object": "agentd.inprocess.state",
    "last_sync": "agentd.inprocess.state",
    "Synced": "agentd.inprocess.state",
}
__all__ = [
    "Interrupted",
    "Restart",
    "Synced",
    "current",
    "last_sync",
    "run",
    "sync",
    "sync_object",
]
__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)

if TYPE_CHECKING:
    from agentd.inprocess.state import Synced, last_sync, sync, sync_object
    from agentd.inprocess.worker import Interrupted, Restart, current, run
