"""``torch.distributed.elastic.agent.server.api``: this module *is* agentd's agent template.

It is made the same module object as :mod:`agentd.agent.template`, so that what a test or
a framework patches here (``put_metric``, the template's methods) is what the agent uses.
The names torch exports from it: ``ElasticAgent``, ``SimpleElasticAgent``, ``WorkerSpec``,
``Worker``, ``WorkerGroup``, ``WorkerState``, ``RunResult``, and its private
``_RoleInstanceInfo`` and ``_get_fq_hostname``.
"""

import sys

from agentd.agent import template

sys.modules[__name__] = template
