"""Progress messages: version 2 of the timer pipe's wire format (heartbeats and sections).

One JSON object per line, written atomically like a timer request (see
:mod:`agentd.timer.file_pipe`)::

    {"version": 2, "kind": "beat", "pid": 123, "steps": 4711, "at": 81234.5}
    {"version": 2, "kind": "enter", "pid": 123, "steps": 4711, "at": 81234.6,
     "section": "checkpoint"}

``kind`` is ``beat`` (a step ended), ``enter``/``exit`` (a named section began or ended),
``done`` (the worker will heartbeat no more: stop watching it until its next message),
``parked`` (the same, for an in-process restart's park: not a sample of any timeout), or,
during a drain (:mod:`agentd.drain`), ``drain`` (the step count when the worker learned of
it) and ``saved`` (its checkpoint is written).
``steps`` counts the worker's heartbeats so far, ``at`` is when the message's event
happened on the host's monotonic clock (``time.monotonic()``, the same for every process
of the host). ``dump_signal``, when present, is the signal on which the process
registered :mod:`faulthandler` to dump its stacks.
"""

from __future__ import annotations

import functools
import json
import math
import signal
from typing import NamedTuple

VERSION = 2
PIPE_ENV = "AGENTD_PROGRESS_PIPE"
"""The worker's variable naming the pipe it writes these messages to."""
STACK_FILE_ENV = "AGENTD_STACK_FILE"
"""The worker's variable naming the file its stacks are dumped to (faulthandler)."""
DUMP_SIGNAL_ENV = "AGENTD_DUMP_SIGNAL"
"""The worker's variable naming the signal that dumps its stacks, when the agent has one."""
DUMP_SIGNAL = signal.SIGRTMIN + 5
"""The signal a heartbeating worker registers faulthandler on: a real-time signal, which
no training library uses (SIGUSR1 is SLURM's and Lightning's requeue signal)."""
STACK_FILE = "stacks.txt"
"""Each worker's dump file, in its attempt directory (``$AGENTD_STACK_FILE``)."""
KINDS = ("beat", "enter", "exit", "done", "parked", "drain", "saved")
MAX_SECTION = 128
MAX_STEPS = 1 << 53
"""Steps beyond this lose precision as JSON numbers: no real job gets there."""


class BadMessage(ValueError):
    """A version-2 line that is not a valid progress message (the text names the rule)."""


class ProgressMessage(NamedTuple):
    """One progress event of worker process ``pid`` (see the module's docstring)."""

    pid: int
    kind: str
    steps: int
    at: float
    section: str | None = None
    dump_signal: int = 0


def check_section_name(name: object) -> str:
    """``name`` if it can name a section; ValueError naming the rule otherwise."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_SECTION or "\x00" in name:
        raise ValueError(
            f"section: {name!r} must be a non-empty string of at most {MAX_SECTION} "
            "characters, without NUL"
        )
    return name


def encode(
    kind: str, pid: int, steps: int, at: float, section: str | None = None, dump_signal: int = 0
) -> bytes:
    """The wire line of one message, newline included (at most a few hundred bytes)."""
    line = f'{{"version":2,"kind":"{kind}","pid":{pid},"steps":{steps},"at":{at!r}'
    if section is not None:
        line += ',"section":' + _quoted(section)
    if dump_signal:
        line += f',"dump_signal":{dump_signal}'
    return (line + "}\n").encode()


@functools.lru_cache(maxsize=256)
def _quoted(name: str) -> str:
    """A section name as a JSON string (names repeat: each is escaped once)."""
    return json.dumps(name)


def parse(doc: dict[str, object], max_pid: int) -> ProgressMessage:
    """A decoded version-2 object as a message; :class:`BadMessage` otherwise."""
    kind = doc.get("kind")
    if kind not in KINDS:
        raise BadMessage(f"kind: {kind!r} must be one of {', '.join(KINDS)}")
    pid = doc.get("pid")
    if type(pid) is not int or not 0 < pid <= max_pid:
        raise BadMessage(f"pid: {pid!r} must be a positive integer up to {max_pid}")
    steps = doc.get("steps")
    if type(steps) is not int or not 0 <= steps <= MAX_STEPS:
        raise BadMessage(f"steps: {steps!r} must be an integer within 0..{MAX_STEPS}")
    at = doc.get("at")
    if not isinstance(at, int | float) or isinstance(at, bool) or not 0 <= at < math.inf:
        raise BadMessage(f"at: {at!r} must be a finite number >= 0 (monotonic seconds)")
    section = doc.get("section")
    if kind in ("enter", "exit"):
        try:
            section = check_section_name(section)
        except ValueError as exc:
            raise BadMessage(str(exc)) from None
    elif section is not None:
        raise BadMessage(f"section: only enter and exit messages name one, not {kind}")
    dump = doc.get("dump_signal", 0)
    if type(dump) is not int or not 0 <= dump < signal.NSIG:
        raise BadMessage(
            f"dump_signal: {dump!r} must be a signal number within 0..{signal.NSIG - 1}"
        )
    return ProgressMessage(pid, str(kind), steps, float(at), section, dump)
