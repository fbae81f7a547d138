"""``torch.distributed.elastic.agent.server.api``."""

from agentd.agent.template import ElasticAgent, SimpleElasticAgent
from agentd.group import RunResult, Worker, WorkerGroup, WorkerState
from agentd.spec import WorkerSpec

__all__ = [
    "ElasticAgent",
    "RunResult",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
]
