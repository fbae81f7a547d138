"""``torch.distributed.elastic.agent.server``: the agent API (as its ``.api``)."""

from agentd.elastic.agent.server.api import *  # noqa: F403
from agentd.elastic.agent.server.api import __all__ as __all__
