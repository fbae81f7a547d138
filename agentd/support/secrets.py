"""What a child of the agent never inherits: agentd's secrets.

The store token, the drain token and the etcd password are removed from the environment
of every process the agent starts (workers, the guardian, the zygote, node checks, py-spy,
nvidia-smi, an etcd server, any helper), and a ``password=`` item is cut out of an
inherited ``--rdzv-conf`` variable, so neither a child nor anything it prints can leak
them. :func:`child_env` is the one function that builds a helper's environment; a
worker's starts from :func:`without_secrets` too (``agentd.workers.env``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SECRET_ENV = (
    "AGENTD_STORE_TOKEN",
    "PET_STORE_TOKEN",
    "AGENTD_DRAIN_TOKEN",
    "AGENTD_ETCD_PASSWORD",
)
"""Variables that hold agentd's secrets: never passed to a child."""
_CONF_ENV = ("AGENTD_RDZV_CONF", "PET_RDZV_CONF")
"""``--rdzv-conf`` as variables: kept, without their ``password=`` item."""


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without agentd's secrets (see the module docstring)."""
    env = {k: v for k, v in environ.items() if k not in SECRET_ENV}
    for name in _CONF_ENV:
        if name in env:
            items = [i for i in env[name].split(",") if i.split("=", 1)[0].strip() != "password"]
            env[name] = ",".join(items)
    return env


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process the agent starts: its own, without its secrets, plus
    ``extra``."""
    env = without_secrets(os.environ)
    env.update(extra or {})
    return env
