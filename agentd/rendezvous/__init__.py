"""Rendezvous: how the agents of one job find each other and agree on ranks.

Names are imported on first use: a job loads only the backend it runs.
"""

from typing import TYPE_CHECKING

from agentd.support.lazy import lazy_getattr

_EXPORTS = {
    "RendezvousHandler": "agentd.rendezvous.api",
    "RendezvousInfo": "agentd.rendezvous.api",
    "StaticRendezvous": "agentd.rendezvous.static",
}
__all__ = ["RendezvousHandler", "RendezvousInfo", "StaticRendezvous"]
__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)

if TYPE_CHECKING:
    from agentd.rendezvous.api import RendezvousHandler, RendezvousInfo
    from agentd.rendezvous.static import StaticRendezvous
