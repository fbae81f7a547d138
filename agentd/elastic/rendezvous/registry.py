"""``torch.distributed.elastic.rendezvous.registry``: this module *is* agentd's registry.

It is made the same module object as :mod:`agentd.rendezvous.registry`, so that a patch of
``get_rendezvous_handler`` here is what the launcher calls.
"""

import sys

from agentd.rendezvous import registry

sys.modules[__name__] = registry
