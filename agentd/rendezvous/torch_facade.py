"""torch's synchronous face of an agentd rendezvous handler.

What :func:`agentd.rendezvous.registry.get_rendezvous_handler` returns, so that code
written for torch's handlers (``handler.shutdown()`` after ``agent.run()``,
``handler.get_run_id()``, ``handler.is_closed()``) works as it is. The agent does not go
through this face: it drives :attr:`TorchRendezvousHandler.handler`, agentd's async
handler, on its loop. Each blocking method here runs on an event loop of its own and
refuses inside a running loop (await the handler's method there).
"""

from __future__ import annotations

from typing import Any

from agentd.rendezvous.api import RendezvousHandler, RendezvousInfo
from agentd.support.sync_bridge import run_blocking


class TorchRendezvousHandler:
    """``handler``'s methods, synchronous, under torch's names."""

    def __init__(self, handler: RendezvousHandler) -> None:
        self.handler = handler
        self._closed = False

    def get_backend(self) -> str:
        return self.handler.get_backend()

    def get_run_id(self) -> str:
        return self.handler.get_run_id()

    @property
    def use_agent_store(self) -> bool:
        return self.handler.use_agent_store

    def next_rendezvous(self) -> RendezvousInfo:
        return run_blocking(self.handler.next_rendezvous(), "handler.handler.next_rendezvous()")

    def num_nodes_waiting(self) -> int:
        return run_blocking(self.handler.num_nodes_waiting(), "handler.handler.num_nodes_waiting()")

    def is_closed(self) -> bool:
        return self._closed or bool(getattr(self.handler, "closed", False))

    def set_closed(self) -> None:
        self._closed = True
        run_blocking(
            self.handler.set_closed(False, "closed by the caller"), "handler.handler.set_closed()"
        )

    def shutdown(self) -> bool:
        """Leave the rendezvous (after a run, the agent has already left: nothing to do)."""
        run_blocking(self.handler.shutdown(), "handler.handler.shutdown()")
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handler, name)
