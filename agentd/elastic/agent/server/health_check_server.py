"""``torch.distributed.elastic.agent.server.health_check_server``."""

from agentd.health.server import HealthCheckServer, create_healthcheck_server

__all__ = ["HealthCheckServer", "create_healthcheck_server"]
