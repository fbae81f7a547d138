"""``torch.distributed.elastic.timer``: expiration timers."""

from agentd.timer import *  # noqa: F403
from agentd.timer import __all__ as __all__
