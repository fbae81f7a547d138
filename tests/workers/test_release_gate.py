"""Function workers leave together: one whose function returns first stays until the last
of its attempt has returned (a gloo peer would otherwise abort at exit)."""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

from agentd import LocalElasticAgent, WorkerSpec, WorkerState


def note_exit(folder: str) -> int:
    rank = int(os.environ["RANK"])
    time.sleep(1.5 if rank == 1 else 0)
    Path(folder, f"returned-{rank}").write_text(repr(time.time()))
    atexit.register(lambda: Path(folder, f"exited-{rank}").write_text(repr(time.time())))
    return rank


def test_a_worker_done_first_exits_after_the_last_one_returned(tmp_path):
    spec = WorkerSpec(role="t", local_world_size=2, entrypoint=note_exit, args=(str(tmp_path),))
    result = LocalElasticAgent(spec, log_dir=str(tmp_path / "logs")).run()
    assert result.state is WorkerState.SUCCEEDED and result.return_values == {0: 0, 1: 1}
    stamp = {p.name: float(p.read_text()) for p in tmp_path.glob("*-*")}
    assert stamp["exited-0"] >= stamp["returned-1"] > stamp["returned-0"]
