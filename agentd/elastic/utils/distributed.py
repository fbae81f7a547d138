"""``torch.distributed.elastic.utils.distributed``: free ports on this host."""

from agentd.support.net import get_free_port, get_socket_with_port

__all__ = ["get_free_port", "get_socket_with_port"]
