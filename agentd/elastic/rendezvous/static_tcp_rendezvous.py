"""``torch.distributed.elastic.rendezvous.static_tcp_rendezvous``."""

from agentd.rendezvous.static import StaticRendezvous as StaticTCPRendezvous

__all__ = ["StaticTCPRendezvous"]
