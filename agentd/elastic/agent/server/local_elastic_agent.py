"""``torch.distributed.elastic.agent.server.local_elastic_agent``."""

from agentd.agent.local import LocalElasticAgent
from agentd.assembly.torch_env import (
    TORCHELASTIC_ENABLE_FILE_TIMER,
    TORCHELASTIC_HEALTH_CHECK_PORT,
    TORCHELASTIC_TIMER_FILE,
    TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT,
)

__all__ = [
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_HEALTH_CHECK_PORT",
    "TORCHELASTIC_TIMER_FILE",
    "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT",
    "LocalElasticAgent",
]
