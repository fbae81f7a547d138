"""``result.json``: the run's outcome and root cause, written even when the disk is full.

The file is reserved when the agent starts: a small placeholder document padded with
whitespace to :data:`RESERVED_BYTES`, so its blocks are allocated while there is room.
The outcome then overwrites it in place, which needs no new blocks: the placeholder's
JSON is shorter than any outcome, so the file holds one valid document (with whitespace
after it) even before it is cut to size. An outcome larger than the reservation is
written whole when the disk allows; when it does not, tracebacks and tails are trimmed
until it fits the reservation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentd.group import RunResult, WorkerFailure

log = logging.getLogger(__name__)

RESERVED_BYTES = 64 * 1024
_TRIMMED = 2048
"""What is kept of each traceback and tail when the outcome must shrink to fit."""


class ResultFile:
    """The ``result.json`` of one run at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reserved = False

    def reserve(self, placeholder: dict[str, Any]) -> None:
        """Allocate the file now, holding ``placeholder``; a failure is only logged (the
        outcome is tried again at the end). The write itself claims the blocks (ext4 and
        XFS reserve delayed allocations at write time, tmpfs allocates), so no ``fsync``
        holds up the start: the reservation is for a full disk later, not for a crash."""
        data = _encode(placeholder)
        try:
            with open(self.path, "wb") as fp:
                fp.write(data + b" " * max(0, RESERVED_BYTES - len(data)))
        except OSError as exc:
            log.warning("Could not reserve %s: %s", self.path, exc.strerror)
            return
        self.reserved = True

    def write(self, outcome: dict[str, Any]) -> bool:
        """Record ``outcome``; returns whether it reached the file."""
        data = _encode(outcome)
        if len(data) > RESERVED_BYTES or not self.reserved:
            if self._replace(data):
                return True
            data = _encode(_trimmed(outcome))
        if len(data) <= RESERVED_BYTES and self.reserved and self._overwrite(data):
            return True
        log.error("Could not write %s: the report above is the only record of this run", self.path)
        return False

    def _overwrite(self, data: bytes) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY)
        except OSError as exc:
            log.warning("Could not open %s: %s", self.path, exc.strerror)
            return False
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            return True
        except OSError as exc:
            log.warning("Could not write %s: %s", self.path, exc.strerror)
            return False
        finally:
            os.close(fd)

    def _replace(self, data: bytes) -> bool:
        """Write ``data`` to a new file and rename it over the old one (needs free space)."""
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            temporary.write_bytes(data)
            os.replace(temporary, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()
            return False
        self.reserved = False  # the new file has just the outcome's size
        return True


def _encode(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


def _trimmed(outcome: dict[str, Any]) -> dict[str, Any]:
    """``outcome`` with every traceback and stderr tail cut to its last lines."""

    def trim(failure: dict[str, Any] | None) -> dict[str, Any] | None:
        if failure is None:
            return None
        return {
            k: (v[-_TRIMMED:] if k in ("traceback", "stderr_tail") and isinstance(v, str) else v)
            for k, v in failure.items()
        }

    failures = outcome.get("failures") or []
    return {
        **outcome,
        "root_cause": trim(outcome.get("root_cause")),
        "failures": [trim(f) for f in failures[-8:]],
        "failures_trimmed": len(failures) > 8,
    }


def outcome(
    facts: dict[str, Any],
    result: RunResult | None,
    last_failure: WorkerFailure | None,
    error: BaseException | None,
    lost_peer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``result.json`` document: ``facts`` about the run, how it ended, and why.

    The root cause is the run's last result's when it has one, else the latest failure
    seen (a crash the agent restarted from before something else ended the run); the
    ``error`` that ended the run, if any, is named with the exit code it leads to. When a
    peer's loss failed this node's workers (``lost_peer``), the root cause is that node
    (``{"lost_node": {...}}``), and this node's failures are listed as what followed.
    """
    failures = sorted(result.failures.values(), key=lambda f: f.timestamp) if result else []
    root = result.root_cause if result and result.failures else last_failure
    if not failures and last_failure is not None:
        failures = [last_failure]
    doc = {**facts, "outcome": _outcome_word(facts.get("state"), error)}
    if error is not None:
        doc["error"] = str(error) or type(error).__name__
        doc["exit_code"] = getattr(error, "exit_code", 1)
    else:
        doc["exit_code"] = 1 if result is not None and result.is_failed() else 0
    doc["root_cause"] = root.to_dict() if root is not None else None
    if lost_peer is not None:  # the node that vanished; this node's failures followed it
        doc["root_cause"] = {"lost_node": lost_peer}
    doc["failures"] = [f.to_dict() for f in failures]
    return doc


def _outcome_word(state: object, error: BaseException | None) -> str:
    if error is None:
        return "succeeded" if state == "SUCCEEDED" else "failed"
    if getattr(error, "exit_code", 1) == 0:
        return "succeeded"
    return "stopped" if state == "STOPPED" else "failed"
