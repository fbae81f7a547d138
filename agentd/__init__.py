"""agentd: an asyncio elastic agent for distributed training jobs, a drop-in for torchrun.

Public names are imported lazily, so ``import agentd`` (and every worker-side helper, such
as the guardian) starts fast and pulls in only what it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.support.lazy import lazy_getattr

__version__ = "0.1.0"

_EXPORTS = {
    "WorkerSpec": "agentd.spec",
    "Worker": "agentd.group",
    "WorkerGroup": "agentd.group",
    "WorkerState": "agentd.group",
    "WorkerFailure": "agentd.group",
    "RunResult": "agentd.group",
    "Std": "agentd.spec",
    "ElasticAgent": "agentd.agent.template",
    "SimpleElasticAgent": "agentd.agent.template",
    "LocalElasticAgent": "agentd.agent.local",
    "AgentSettings": "agentd.assembly.settings",
    "RestartBackoff": "agentd.restart_policy",
    "RestartPolicy": "agentd.restart_policy",
    "AgentConfig": "agentd.config.resolve",
    "record": "agentd.errors.record",
    "HeartbeatSettings": "agentd.heartbeats.settings",
    "heartbeat": "agentd.heartbeats.client",
    "section": "agentd.heartbeats.client",
    "end_heartbeats": "agentd.heartbeats.client",
    "checkpoint_requested": "agentd.drain.client",
    "checkpoint_saved": "agentd.drain.client",
    "on_checkpoint_request": "agentd.drain.client",
    "AgentdError": "agentd.exceptions",
    "ConfigError": "agentd.exceptions",
    "StartError": "agentd.exceptions",
    "AgentStopped": "agentd.exceptions",
}
__all__ = [
    "AgentConfig",
    "AgentSettings",
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
    "checkpoint_requested",
    "checkpoint_saved",
    "end_heartbeats",
    "heartbeat",
    "on_checkpoint_request",
    "record",
    "section",
]


__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)


if TYPE_CHECKING:
    from agentd.agent.local import LocalElasticAgent
    from agentd.agent.template import ElasticAgent, SimpleElasticAgent
    from agentd.assembly.settings import AgentSettings
    from agentd.config.resolve import AgentConfig
    from agentd.drain.client import checkpoint_requested, checkpoint_saved, on_checkpoint_request
    from agentd.errors.record import record
    from agentd.exceptions import AgentdError, AgentStopped, ConfigError, StartError
    from agentd.group import RunResult, Worker, WorkerFailure, WorkerGroup, WorkerState
    from agentd.heartbeats.client import end_heartbeats, heartbeat, section
    from agentd.heartbeats.settings import HeartbeatSettings
    from agentd.restart_policy import RestartBackoff, RestartPolicy
    from agentd.spec import Std, WorkerSpec
