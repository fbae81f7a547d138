"""What a child of the agent never inherits: agentd's secrets.

The store token, the drain token and the etcd password are removed from the environment
of every process the agent starts (workers, the guardian, the zygote, node checks, py-spy,
nvidia-smi, an etcd server, any helper), and a ``password=`` item is cut out of an
inherited ``--rdzv-conf`` variable, so neither a child nor anything it prints can leak
them. :func:`child_env` is the one function that builds a helper's environment; a
worker's starts from :func:`without_secrets` too (``agentd.workers.env``).

The secret files this process publishes (its store's and health endpoint's tokens,
:mod:`agentd.store.token_file`) are told to :func:`on_published`'s listeners: the guardian
removes those a killed agent could not withdraw.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path

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
            env[name] = without_password(env[name])
    return env


def without_password(conf: str) -> str:
    """``--rdzv-conf`` text (``key=value,...``) without its ``password=`` item."""
    return ",".join(i for i in conf.split(",") if i.split("=", 1)[0].strip() != "password")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process the agent starts: its own, without its secrets, plus
    ``extra``."""
    env = without_secrets(os.environ)
    env.update(extra or {})
    return env


SecretListener = Callable[[Path, "str | None"], None]
"""Told a secret file's path and its content as it is published, None as it is withdrawn."""

_published: dict[Path, str] = {}
"""The secret files this process published and has not withdrawn."""
_listeners: list[SecretListener] = []


def on_published(listener: SecretListener) -> Callable[[], None]:
    """Tell ``listener`` of every secret file this process has published and not withdrawn,
    and from now on of each one published or withdrawn; returns what stops the calls."""
    _listeners.append(listener)
    for path, content in list(_published.items()):
        listener(path, content)

    def stop() -> None:
        with contextlib.suppress(ValueError):
            _listeners.remove(listener)

    return stop


def published(path: Path, content: str) -> None:
    """This process wrote the secret ``content`` to ``path``."""
    _published[path] = content
    for listener in list(_listeners):
        listener(path, content)


def withdrawn(path: Path, content: str) -> None:
    """This process removed ``path``, or would have if it still held ``content``."""
    if _published.get(path) == content:
        del _published[path]
        for listener in list(_listeners):
            listener(path, None)
