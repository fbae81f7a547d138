"""The in-process restart channel between an agent and one worker: JSON lines on a Unix
socket pair, the worker's end passed as the descriptor named by :data:`CHANNEL_FD_ENV`.

Worker to agent: ``{"op": "hello"}`` (this process restarts in place),
``{"op": "error", "message": "..."}`` (the training function raised: a failure, but the
process may be kept), ``{"op": "parked"}`` (its process group is destroyed; it waits for
``resume``).
Agent to worker: ``{"op": "park"}`` (leave the training function now),
``{"op": "resume", "env": {...}}`` (the new attempt's variables that changed; call the
training function again). A line over :data:`MAX_LINE` bytes, or one that is not such an
object, is a protocol error: the agent logs it once and stops trusting that worker's
channel (the worker is then restarted as a process).
"""

from __future__ import annotations

import json
from typing import Any

CHANNEL_FD_ENV = "AGENTD_INPROCESS_FD"
REPLACED_ENV = "AGENTD_INPROCESS_REPLACED"
"""Global ranks started as new processes in this attempt while others kept theirs
(comma-separated; empty or unset when every rank is new or none is)."""
SOURCE_ENV = "AGENTD_INPROCESS_SOURCE"
"""The global rank of a rank that kept its process: it holds the state to hand over."""
ROUND_ENV = "AGENTD_INPROCESS_ROUND"
"""The rendezvous round (generation) of this attempt, the same on every rank: a kept process
whose node missed a round (one was sealed without it: the others may have trained) holds an
older round's state than the ranks of the last round (:mod:`agentd.inprocess.holders`)."""
STALE_ENV = "AGENTD_INPROCESS_STALE"
"""``1`` for a kept worker whose node missed a round since its last attempt (one was sealed
without it: :meth:`~agentd.rendezvous.api.KeepsWorkers.sat_out`): its ranks may have
trained on, and this process's state is older than the job's
(:mod:`agentd.inprocess.holders`: it holds nothing, and receives)."""
FRESH_ENV = "AGENTD_INPROCESS_FRESH"
"""``1`` when no rank of this attempt kept its process (a fresh start, or a restart that
used new processes for every rank): the job's state is then only in its checkpoint."""
GRACE_ENV = "AGENTD_INPROCESS_GRACE"
"""How long a worker whose training function raised waits for a ``park`` before it fails:
its peers' loss may take the agent that long to learn (seconds)."""
DEFAULT_GRACE = 2.0
NCCL_ABORT_ENV = "AGENTD_INPROCESS_NCCL_ABORT"
"""How a parked worker aborts its NCCL groups: ``background`` (the default: torch forgets
them at once, and a thread aborts them while the next attempt starts; their GPU buffers
are held until it ends, about a second) or ``wait`` (the park waits for the abort)."""
NCCL_ABORT_MODES = ("background", "wait")
MAX_LINE = 1 << 20

WORKER_OPS = frozenset({"hello", "error", "parked"})
MAX_MESSAGE = 2000
AGENT_OPS = frozenset({"park", "resume"})


class ProtocolError(ValueError):
    """A line on the channel that is not a message of the other side."""


def encode(op: str, **fields: Any) -> bytes:
    return json.dumps({"op": op, **fields}, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes, ops: frozenset[str]) -> dict[str, Any]:
    """The message on ``line`` (one of ``ops``), or :class:`ProtocolError` naming why not."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"line of {len(line)} bytes exceeds {MAX_LINE}")
    try:
        message = json.loads(line)
    except ValueError:
        raise ProtocolError(f"not JSON: {line[:80]!r}") from None
    if not isinstance(message, dict) or message.get("op") not in ops:
        raise ProtocolError(f"op must be one of {sorted(ops)}: {line[:80]!r}")
    if not isinstance(message.get("message", ""), str):
        raise ProtocolError(f"message must be a string: {line[:80]!r}")
    env = message.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ProtocolError(f"env must map names to strings: {line[:80]!r}")
    return message
