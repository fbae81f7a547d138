"""The exceptions agentd raises. The CLI turns each into one line and an exit code."""

from __future__ import annotations

import errno
import os
import signal


class AgentdError(Exception):
    """Base of every error agentd raises on purpose."""

    exit_code = 1


class ConfigError(AgentdError, ValueError):
    """A configuration value, flag or spec field broke a rule (names field, value and rule)."""

    exit_code = 2


class StartError(AgentdError):
    """The agent could not start (a store unreachable, a log directory not writable, ...)."""

    exit_code = 3


DRAINED_UNFINISHED = 5
"""The exit code of a node drained from a job that cannot finish without it: no other
node ran the job, which ended there, or the job runs only at its size (a static job,
``--nnodes N``), whose other nodes wait for a node in its place. Its checkpoints are
saved. Not a success: a scheduler that records one starts no node in its place."""


class Drained(AgentdError):
    """This node was drained: its workers checkpointed and it left the job. Exit 0 when
    the job goes on without it, :data:`DRAINED_UNFINISHED` when it cannot."""

    def __init__(self, exit_code: int = 0) -> None:
        unfinished = exit_code == DRAINED_UNFINISHED
        super().__init__(
            "node drained; its job cannot finish without it, or a node in its place"
            if unfinished
            else "node drained"
        )
        self.exit_code = exit_code


class IllegalTransition(AgentdError):
    """A worker group was asked to move between two states the state machine does not link."""


class AgentStopped(AgentdError):
    """The agent stopped its workers because it received a stop signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.exit_code = 128 + signum


class SignalException(AgentStopped):
    """torch's name for a stop by signal: ``SignalException(msg, sigval)``."""

    def __init__(self, msg: str, sigval: int) -> None:
        super().__init__(sigval)
        self.args = (msg,)
        self.sigval = signal.Signals(sigval)


def field_error(field: str, value: object, rule: str) -> ConfigError:
    """Build the standard one-line error: ``<field>: <value!r> <rule>``."""
    return ConfigError(f"{field}: {value!r} {rule}")


def cannot_listen(
    exc: OSError, host: str, port: int, what: str, host_what: str | None = None
) -> StartError:
    """Why a listener could not bind ``host:port``, in one line naming the field at fault:
    ``host_what`` (the one that gave the address) where this host has no such address,
    else ``what`` (the port's, or the listener's), with the system's reason in its own
    words (asyncio wraps it in a sentence of its own)."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno == errno.EADDRNOTAVAIL and host_what:
        return StartError(f"{host_what}: {host!r} is not an address of this host ({reason})")
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return StartError(f"{what}: cannot listen on {endpoint} ({reason})")
