"""A PyTorch Lightning callback: a heartbeat per training batch, sections for the rest,
and a checkpoint when a drain asks for one.

``Trainer(callbacks=[HeartbeatCallback()])``. Each training batch ends with a heartbeat;
validation runs in the section ``validation`` (with a heartbeat per batch, so its
timeout is learned from batches, not from whole validation runs); every checkpoint write
runs in the section ``checkpoint``; the end of training (or an exception) ends the
heartbeats, so teardown is not taken for a hang. When a drain asks every rank for a
checkpoint (:mod:`agentd.drain`), every rank calls ``trainer.save_checkpoint`` at the same
batch, to ``drain_checkpoint`` (default ``<default_root_dir>/drain.ckpt``), and says it
is saved; resume with ``trainer.fit(..., ckpt_path=...)``. Built on ``lightning.pytorch``
(or, when only that is installed, ``pytorch_lightning``).

A stop (the agent's SIGTERM, after a drain or for a restart) ends training at the next
batch, as Lightning decides it: every rank learns rank 0's SIGTERM through the broadcast
Lightning makes each batch. Lightning 2.6's SIGTERM handler also broadcasts from within
the handler, which runs wherever the rank happens to be (in another collective, say), so
the ranks of a DDP job could block one another until the stop's timeout killed them (1
stop in 8 of a drained job); the callback's handler does the rest of what Lightning's
does, without that broadcast.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import agentd.drain.client as drain
import agentd.heartbeats.client as progress
from agentd.support.compat.lightning import sigterm_without_broadcast

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback  # type: ignore[no-redef,assignment]


class HeartbeatCallback(Callback):  # type: ignore[misc]
    """Heartbeats and sections for agentd's hang detection (see the module docstring)."""

    def __init__(self, drain_checkpoint: str | None = None) -> None:
        self._validation: progress.section | None = None
        self.drain_checkpoint = drain_checkpoint

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        sigterm_without_broadcast(trainer)
        io = trainer.strategy.checkpoint_io
        save = io.save_checkpoint
        if getattr(save, "_agentd_section", False):
            return

        @functools.wraps(save)
        def save_in_section(*args: Any, **kwargs: Any) -> Any:
            with progress.section("checkpoint"):
                return save(*args, **kwargs)

        save_in_section._agentd_section = True  # type: ignore[attr-defined]
        io.save_checkpoint = save_in_section

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        progress.heartbeat()
        if drain.checkpoint_requested():  # on every rank at this same batch
            path = self.drain_checkpoint or os.path.join(trainer.default_root_dir, "drain.ckpt")
            trainer.save_checkpoint(path)
            drain.checkpoint_saved()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._leave_validation()
        self._validation = progress.section("validation").__enter__()

    def on_validation_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        progress.heartbeat()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._leave_validation()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._leave_validation()
        progress.end_heartbeats()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._leave_validation()
        progress.end_heartbeats()

    def _leave_validation(self) -> None:
        if self._validation is not None:
            self._validation.__exit__(None, None, None)
            self._validation = None
