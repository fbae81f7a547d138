"""``torch.distributed.elastic.rendezvous.etcd_server``."""

from agentd.rendezvous.etcd_server import EtcdServer

__all__ = ["EtcdServer"]
