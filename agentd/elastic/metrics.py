"""``torch.distributed.elastic.metrics``."""

from agentd.metrics import configure, prof, put_metric

__all__ = ["configure", "prof", "put_metric"]
