"""``torch.distributed.elastic.metrics``."""

from agentd.reports.metrics_api import (
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    NullMetricHandler,
    configure,
    getStream,
    prof,
    put_metric,
)

__all__ = [
    "ConsoleMetricHandler",
    "MetricData",
    "MetricHandler",
    "NullMetricHandler",
    "configure",
    "getStream",
    "prof",
    "put_metric",
]
