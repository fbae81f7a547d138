"""``torch.distributed.elastic.agent.server.local_elastic_agent``."""

from agentd.agent.local import LocalElasticAgent

__all__ = ["LocalElasticAgent"]
