"""``torch.distributed.elastic.multiprocessing``: the names of its ``.api``."""

from agentd.elastic.multiprocessing.api import *  # noqa: F403
from agentd.elastic.multiprocessing.api import __all__ as __all__
