"""``torch.distributed.elastic.rendezvous.api``."""

from agentd.elastic.rendezvous import *  # noqa: F403
from agentd.elastic.rendezvous import __all__ as __all__
