"""``torch.distributed.elastic.events``.

agentd's events (:mod:`agentd.telemetry.events`) plus torch's rendezvous-event functions,
written here because torch's users patch them here: ``get_logging_handler`` and
``record_rdzv_event`` are looked up in this module at each call.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import traceback

from agentd.telemetry.events import Event, EventSource, configure, record
from agentd.telemetry.rdzv_events import NodeState, RdzvEvent

__all__ = [
    "Event",
    "EventSource",
    "NodeState",
    "RdzvEvent",
    "configure",
    "construct_and_record_rdzv_event",
    "get_logging_handler",
    "record",
    "record_rdzv_event",
]

_HANDLERS = {"console": logging.StreamHandler, "dynamic_rendezvous": logging.NullHandler}
_loggers: dict[str, logging.Logger] = {}


def get_logging_handler(destination: str = "null") -> logging.Handler:
    """The handler for an event destination: ``console`` prints, anything else is silent."""
    return _HANDLERS.get(destination, logging.NullHandler)()


def _get_or_create_logger(destination: str = "null") -> logging.Logger:
    """torch's ``torchelastic-events-<destination>`` logger, with that destination's
    handler, made once."""
    if destination not in _loggers:
        logger = logging.getLogger(f"torchelastic-events-{destination}")
        logger.setLevel(os.environ.get("LOGLEVEL", "INFO"))
        logger.propagate = False
        logger.addHandler(get_logging_handler(destination))
        _loggers[destination] = logger
    return _loggers[destination]


def record_rdzv_event(event: RdzvEvent) -> None:
    """Log a rendezvous event to the ``dynamic_rendezvous`` destination."""
    _get_or_create_logger("dynamic_rendezvous").info(event.serialize())


def construct_and_record_rdzv_event(
    run_id: str,
    message: str,
    node_state: NodeState,
    name: str = "",
    hostname: str = "",
    pid: int | None = None,
    master_endpoint: str = "",
    local_id: int | None = None,
    rank: int | None = None,
) -> None:
    """Build a :class:`RdzvEvent` named after the calling file and function and record
    it; nothing is built while the ``dynamic_rendezvous`` destination is silent."""
    if isinstance(get_logging_handler("dynamic_rendezvous"), logging.NullHandler):
        return
    stack = inspect.stack()
    caller = stack[1] if len(stack) > 1 else None
    del stack  # frames hold references; do not keep them
    filename = os.path.basename(caller.filename) if caller else "no_file"
    name = name or (caller.function if caller else "")
    event = RdzvEvent(
        name=f"{filename}:{name}",
        run_id=run_id,
        message=message,
        hostname=hostname or socket.getfqdn(),
        pid=pid or os.getpid(),
        node_state=node_state,
        master_endpoint=master_endpoint,
        rank=rank,
        local_id=local_id,
        error_trace=traceback.format_exc() if node_state == NodeState.FAILED else "",
    )
    record_rdzv_event(event)
