"""``torch.distributed.elastic.agent.server.local_elastic_agent``."""

from agentd.local_agent import LocalElasticAgent

__all__ = ["LocalElasticAgent"]
