"""``torch.distributed.elastic.rendezvous.c10d_rendezvous_backend``: the ``c10d`` backend
is agentd's own store, served by the first agent; build it with the registry."""

from agentd.rendezvous.registry import RendezvousParameters, get_rendezvous_handler

__all__ = ["RendezvousParameters", "get_rendezvous_handler"]
