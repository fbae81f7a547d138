"""``torch.distributed.elastic.agent.server.api``."""

from agentd.agent.template import ElasticAgent, SimpleElasticAgent
from agentd.spec import RunResult, Worker, WorkerGroup, WorkerSpec, WorkerState

__all__ = [
    "ElasticAgent",
    "RunResult",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
]
