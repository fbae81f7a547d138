"""agentd: an asyncio elastic agent for distributed training jobs, a drop-in for torchrun.

Public names are imported lazily, so ``import agentd`` (and every worker-side helper, such
as the guardian) starts fast and pulls in only what it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.lazy import lazy_getattr

__version__ = "0.1.0"

_EXPORTS = {
    "WorkerSpec": "agentd.spec",
    "Worker": "agentd.spec",
    "WorkerGroup": "agentd.spec",
    "WorkerState": "agentd.spec",
    "WorkerFailure": "agentd.spec",
    "RunResult": "agentd.spec",
    "Std": "agentd.spec",
    "ElasticAgent": "agentd.agent",
    "SimpleElasticAgent": "agentd.agent",
    "LocalElasticAgent": "agentd.local_agent",
    "RestartBackoff": "agentd.restart",
    "RestartPolicy": "agentd.restart",
    "AgentConfig": "agentd.config",
    "record": "agentd.errors",
    "HeartbeatSettings": "agentd.heartbeats.timeouts",
    "heartbeat": "agentd.progress",
    "section": "agentd.progress",
    "end_heartbeats": "agentd.progress",
    "AgentdError": "agentd.exceptions",
    "ConfigError": "agentd.exceptions",
    "StartError": "agentd.exceptions",
    "AgentStopped": "agentd.exceptions",
}
__all__ = [
    "AgentConfig",
    "AgentStopped",
    "AgentdError",
    "ConfigError",
    "ElasticAgent",
    "HeartbeatSettings",
    "LocalElasticAgent",
    "RestartBackoff",
    "RestartPolicy",
    "RunResult",
    "SimpleElasticAgent",
    "StartError",
    "Std",
    "Worker",
    "WorkerFailure",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
    "end_heartbeats",
    "heartbeat",
    "record",
    "section",
]


__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)


if TYPE_CHECKING:
    from agentd.agent import ElasticAgent, SimpleElasticAgent
    from agentd.config import AgentConfig
    from agentd.errors import record
    from agentd.exceptions import AgentdError, AgentStopped, ConfigError, StartError
    from agentd.heartbeats.timeouts import HeartbeatSettings
    from agentd.local_agent import LocalElasticAgent
    from agentd.progress import end_heartbeats, heartbeat, section
    from agentd.restart import RestartBackoff, RestartPolicy
    from agentd.spec import (
        RunResult,
        Std,
        Worker,
        WorkerFailure,
        WorkerGroup,
        WorkerSpec,
        WorkerState,
    )
