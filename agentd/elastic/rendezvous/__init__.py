"""``torch.distributed.elastic.rendezvous``."""

from agentd.rendezvous.api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousTimeoutError,
)
from agentd.rendezvous.registry import RendezvousParameters

__all__ = [
    "RendezvousClosedError",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousTimeoutError",
]
