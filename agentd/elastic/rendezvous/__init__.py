"""``torch.distributed.elastic.rendezvous``."""

from agentd.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from agentd.rendezvous.registry import (
    RendezvousHandlerCreator,
    RendezvousHandlerRegistry,
    RendezvousParameters,
    rendezvous_handler_registry,
)

__all__ = [
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerCreator",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "rendezvous_handler_registry",
]
