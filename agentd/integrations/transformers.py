"""A Hugging Face ``TrainerCallback``: a heartbeat per step, sections for eval and saves,
and a checkpoint when a drain asks for one.

``Trainer(..., callbacks=[HeartbeatCallback()])``. Each optimizer step ends with a
heartbeat. When the trainer is about to evaluate or save after a step (its
``control.should_evaluate`` / ``should_save``), the callback enters the section
``evaluate`` or ``checkpoint`` (a save that follows an evaluation encloses it), and
leaves it when the trainer reports it done; evaluation batches heartbeat inside their
section. The end of training ends the heartbeats, so teardown is not taken for a hang.
When a drain asks every rank for a checkpoint (:mod:`agentd.drain`), the callback asks the
trainer to save at this step (``control.should_save``: the trainer's own checkpoint, in
``output_dir``, resumable with ``resume_from_checkpoint``) and says it is saved once the
trainer has written it.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

import agentd.drain.client as drain
import agentd.heartbeats.client as progress


class HeartbeatCallback(TrainerCallback):  # type: ignore[misc]
    """Heartbeats and sections for agentd's hang detection (see the module docstring)."""

    def __init__(self) -> None:
        self._open: list[progress.section] = []
        self._draining = False

    def _enter(self, name: str) -> None:
        self._open.append(progress.section(name).__enter__())

    def _leave(self, name: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].name == name:
                for opened in reversed(self._open[i:]):
                    opened.__exit__(None, None, None)
                del self._open[i:]
                return

    def _leave_all(self) -> None:
        for opened in reversed(self._open):
            opened.__exit__(None, None, None)
        self._open.clear()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._leave_all()  # a section the trainer never reported done must not linger
        progress.heartbeat()
        if drain.checkpoint_requested():  # on every rank at this same step
            control.should_save = True
            self._draining = True
        if control.should_save:
            self._enter("checkpoint")
        if control.should_evaluate:
            self._enter("evaluate")

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        progress.heartbeat()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._leave("evaluate")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._leave("checkpoint")
        if self._draining:
            self._draining = False
            drain.checkpoint_saved()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._leave_all()
        progress.end_heartbeats()
