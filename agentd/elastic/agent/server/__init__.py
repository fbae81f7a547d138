"""``torch.distributed.elastic.agent.server``: the agent API (as its ``.api``)."""

from agentd.agent.template import (
    ElasticAgent,
    RunResult,
    SimpleElasticAgent,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from agentd.assembly.torch_env import TORCHELASTIC_ENABLE_FILE_TIMER, TORCHELASTIC_TIMER_FILE

__all__ = [
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_TIMER_FILE",
    "ElasticAgent",
    "RunResult",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
]
