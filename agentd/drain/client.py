"""Worker side of a drain: checkpoint at the step the agents chose, then say so.

Under ``agentd run`` a drain (a node leaving on purpose: preemption, maintenance) asks
every rank of the job to checkpoint at the same step before the world changes::

    import agentd

    for batch in loader:
        train_step(batch)
        agentd.heartbeat()                 # counts the steps; the drain needs it
        if agentd.checkpoint_requested():  # true on every rank at the same step
            save(model, step)
            agentd.checkpoint_saved()      # the agents re-form once every rank said so

or register a callback, run at that step from ``heartbeat()``; returning counts as saved::

    @agentd.on_checkpoint_request
    def save_now(step: int) -> None:
        save(model, step)

How the step is chosen: when a drain starts, each rank's next ``heartbeat()`` reports its
step count at once and waits (at most :data:`PAUSE_LIMIT` seconds, usually a few
milliseconds) for the agents' choice: one step past the furthest rank reported, which
every rank of a synchronous job reaches exactly. Without agentd everything here is a
no-op and ``checkpoint_requested()`` is always False.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agentd.wire.control import NO_STEP, ControlView, open_view

PAUSE_LIMIT = 10.0
"""The longest a rank waits for the drain's step. The choice takes milliseconds, or up to
5 s while a node is slow to tell its workers (``TOLD_WITHIN`` in
:mod:`agentd.drain.service`); the limit frees the ranks of a drain whose agents died
before choosing. A rank that stops waiting steps on and checkpoints past the step the
others keep: 2 s was passed on a loaded 2-core machine."""
_POLL = 0.0005

_view: ControlView | None = None
_opened = False
_drain_id = 0
_step = NO_STEP
_fired = 0
_saved = 0
_steps = 0
_callbacks: list[Callable[[int], object]] = []
_send: Callable[[str], None] | None = None


def tick(steps: int, send: Callable[[str], None]) -> None:
    """Called by ``heartbeat()`` at the end of each step (``steps`` so far)."""
    global _view, _opened, _drain_id, _step, _steps, _send
    _steps = steps
    if not _opened:
        _opened, _view, _send = True, open_view(), send
    view = _view
    if view is None:
        return
    drain_id, step = view.read()
    if drain_id == 0:
        return
    if drain_id != _drain_id:  # a new drain: report where we are, wait for the choice
        _drain_id, _step = drain_id, NO_STEP
        send("drain")
        deadline = time.monotonic() + PAUSE_LIMIT
        while step == NO_STEP and time.monotonic() < deadline:
            time.sleep(_POLL)
            drain_id, step = view.read()
    if _step == NO_STEP and step != NO_STEP:
        _step = step
    if _step != NO_STEP and steps >= _step and _fired != _drain_id:
        _fire()


def new_attempt() -> None:
    """A new attempt in this process: its steps count from 0 (a drain asked before it
    keeps its step, which every rank of the attempt counts the same way)."""
    global _steps
    _steps = 0


def checkpoint_requested() -> bool:
    """True from the step the drain names on (the same on every rank); False otherwise,
    and always False without agentd. Call ``heartbeat()`` once per step as well."""
    return _step != NO_STEP and _steps >= _step and _drain_id != _saved


def on_checkpoint_request(callback: Callable[[int], object]) -> Callable[[int], object]:
    """Run ``callback(step)`` at the drain's step, from ``heartbeat()``; when it returns,
    the checkpoint counts as saved. Usable as a decorator."""
    _callbacks.append(callback)
    return callback


def checkpoint_saved() -> None:
    """This rank's checkpoint for the current drain is written (a no-op without one)."""
    global _saved
    if _drain_id == 0 or _saved == _drain_id:
        return
    _saved = _drain_id
    if _send is not None:
        _send("saved")


def _fire() -> None:
    global _fired
    _fired = _drain_id
    if not _callbacks:
        return
    for callback in list(_callbacks):
        callback(_steps)
    checkpoint_saved()
