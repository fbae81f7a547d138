"""``torch.distributed.elastic.rendezvous.static_tcp_rendezvous``.

:class:`StaticTCPRendezvous` takes torch's constructor (``master_addr, master_port, rank,
world_size, run_id, timeout``: ``rank`` is the node's rank, ``world_size`` the number of
nodes) and is agentd's static rendezvous under torch's synchronous face: group rank 0's
agent serves the workers' store (``use_agent_store`` is True, as torch's), and a job of
several nodes meets at ``master_addr:master_port`` as ``agentd run --rdzv-backend static``
does (:mod:`agentd.rendezvous.static_nodes`).
"""

from __future__ import annotations

import datetime

from agentd.rendezvous.build import RendezvousRequest, build_rendezvous
from agentd.rendezvous.torch_facade import TorchRendezvousHandler

__all__ = ["StaticTCPRendezvous"]


class StaticTCPRendezvous(TorchRendezvousHandler):
    """Node ``rank`` of ``world_size``, meeting at ``master_addr:master_port``; ``timeout``
    (seconds) bounds the wait for the other nodes."""

    def __init__(
        self,
        master_addr: str,
        master_port: int,
        rank: int,
        world_size: int,
        run_id: str,
        timeout: int,
    ) -> None:
        request = RendezvousRequest(
            nnodes=(world_size, world_size),
            rdzv_backend="static",
            rdzv_conf=f"timeout={timeout}",
            node_rank=rank,
            master_addr=master_addr,
            master_port=master_port,
        )
        super().__init__(build_rendezvous(request, run_id, local_world_size=1))
        self.master_addr, self.master_port = master_addr, master_port
        self.rank, self.world_size, self.run_id = rank, world_size, run_id
        self.timeout = datetime.timedelta(seconds=timeout)
