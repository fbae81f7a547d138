"""``torch.distributed.elastic.metrics.api``: this module *is* agentd's metric API.

It is made the same module object as :mod:`agentd.telemetry.metrics_api`, so that what a
test or a framework patches here (``getStream``, ``put_metric``) is what agentd calls.
"""

import sys

from agentd.telemetry import metrics_api

sys.modules[__name__] = metrics_api
