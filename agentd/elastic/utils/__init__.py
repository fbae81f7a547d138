"""``torch.distributed.elastic.utils`` (and ``.store``, ``.distributed``)."""

from agentd.elastic.utils.distributed import get_free_port, get_socket_with_port

__all__ = ["get_free_port", "get_socket_with_port"]
