"""Rendezvous: how the agents of one job find each other and agree on ranks."""

from agentd.rendezvous.api import RendezvousHandler, RendezvousInfo
from agentd.rendezvous.static import StaticRendezvous

__all__ = ["RendezvousHandler", "RendezvousInfo", "StaticRendezvous"]
