"""``torch.distributed.elastic.rendezvous.registry``."""

from agentd.rendezvous.registry import get_rendezvous_handler

__all__ = ["get_rendezvous_handler"]
