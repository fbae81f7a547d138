"""``torch.distributed.elastic.rendezvous.dynamic_rendezvous``: agentd's dynamic rendezvous
(``c10d``/``agentd`` and the etcd backends all use it)."""

from agentd.rendezvous.dynamic import DynamicRendezvous, RendezvousSettings
from agentd.telemetry.rdzv_events import NodeState

__all__ = ["DynamicRendezvous", "NodeState", "RendezvousSettings"]
