"""A drain after an in-process restart, with a real agent and processes (no torch): every
rank checkpoints at one step of the attempt, the ranks that kept their process as the
new one.

``bench/bench_chaos.py --inprocess --stragglers`` seed 3 (2026-12-04): a slow node was
to be swapped for a spare after the job had restarted in process with new processes for
some ranks. A rank's step count (what it reports to a drain, and what
``checkpoint_requested()`` compares with the drain's step) ran on across the restart in a
kept process, and began at 0 in a new one: the drain's step, one past the furthest
reported, was 200 steps away for the new ranks, which the job ended before reaching; the
slow node never left, and the drain's task ended in a traceback at the agent's exit."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.conftest import TESTS, wait_until

JOB = str(TESTS / "workers" / "inprocess_steps.py")


def notes(out: Path, pattern: str) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in out.glob(pattern) if p.suffix != ".tmp"}


def test_ranks_kept_and_new_after_an_in_process_restart_checkpoint_at_one_step(
    run_agentd, tmp_path
):
    out = tmp_path / "job"
    out.mkdir()
    agent = run_agentd(
        *("--standalone", "--nproc-per-node", "3", "--max-restarts", "1"),
        *("--drain-on", "SIGUSR1", JOB, str(out)),
    )
    wait_until(lambda: len(notes(out, "step5_1_*")) == 3, 60, what="attempt 1 on every rank")
    before, after = notes(out, "step5_0_*"), notes(out, "step5_1_*")
    kept = [r for r in range(3) if before[f"step5_0_{r}"] == after[f"step5_1_{r}"]]
    assert kept == [0, 2], (before, after)  # rank 1 is a new process, the others kept theirs
    agent.proc.send_signal(signal.SIGUSR1)
    # the job ends with the drain (its one node leaves) once every rank saved
    assert agent.wait(60) == 128 + signal.SIGUSR1, agent.stderr()[-3000:]
    ckpts = notes(out, "ckpt_*")
    assert len(ckpts) == 3 and {c["attempt"] for c in ckpts.values()} == {1}, ckpts
    assert len({c["step"] for c in ckpts.values()}) == 1, ckpts  # one step of the attempt
    assert "checkpoints at step" in agent.stderr()
    assert "Traceback" not in agent.stderr()
