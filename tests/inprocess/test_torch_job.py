"""A real 4-rank gloo job restarted in process: the survivors keep their process, their
weights and their step; the new rank gets them; training ends where an uninterrupted run
ends (its weights computed here, step by step, as the job's four ranks would). Skipped
where torch is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TESTS

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

JOB = str(TESTS / "workers" / "torch_inprocess.py")
STEPS = 12


def train(
    tmp_path: Path,
    name: str,
    *crash: str,
    flags: tuple[str, ...] = (),
    standby: bool = True,
    env: dict[str, str] | None = None,
) -> dict[int, dict]:
    out = tmp_path / name
    out.mkdir()
    argv = [
        sys.executable,
        "-m",
        "agentd",
        "run",
        "--standalone",
        "--nproc-per-node",
        "4",
        "--max-restarts",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
        *flags,
        JOB,
        str(out),
        str(STEPS),
        *crash,
    ]
    full = {**os.environ, "TEST_WAIT_STANDBY": "1" if standby else "", **(env or {})}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=full)
    assert done.returncode == 0, done.stderr[-3000:]
    (tmp_path / f"{name}.stderr").write_text(done.stderr)
    reports = [json.loads(p.read_text()) for p in out.glob("rank*.json")]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    return {r["rank"]: r for r in reports}


def uninterrupted_weights(steps: int = STEPS, world: int = 4) -> list[float]:
    """The weights that the job ends with where no rank fails: rank 0's start, then each
    step's gradients of the four ranks' batches, summed (as the all-reduce does) and
    averaged, as workers/torch_inprocess.py trains."""
    with torch.random.fork_rng():
        torch.manual_seed(1234)  # rank 0's, which every rank takes
        model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    true_w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    for step in range(steps):
        grads = []
        for rank in range(world):
            optimizer.zero_grad()
            x = torch.randn(16, 4, generator=torch.Generator().manual_seed(step * 100 + rank))
            torch.nn.functional.mse_loss(model(x), x @ true_w).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *by_rank in zip(model.parameters(), *grads, strict=True):
            p.grad = torch.stack(by_rank).sum(0) / world
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def assert_trained_as_uninterrupted(reports: dict[int, dict]) -> None:
    """Every rank ends with an uninterrupted run's weights (to float rounding: gloo sums
    in its own order)."""
    expected = uninterrupted_weights()
    for rank, report in reports.items():
        assert report["weights"] == pytest.approx(expected, abs=1e-5), rank


@pytest.mark.timeout(300)
def test_a_crashed_rank_is_replaced_and_the_others_keep_training_in_process(tmp_path):
    crashed = train(tmp_path, "crashed", "5")
    for rank in (0, 1, 3):
        assert crashed[rank]["calls"] == 2 and crashed[rank]["restart"] == 1
        assert crashed[rank]["teardown_s"] > 0.0  # its park destroyed its gloo group
    assert crashed[2]["teardown_s"] == 0.0
    assert crashed[2]["calls"] == 1 and crashed[2]["restart"] == 0  # the new process
    assert {r["restart_count"] for r in crashed.values()} == {"1"}
    weights = crashed[0]["weights"]
    assert all(r["weights"] == weights for r in crashed.values())  # handed over exactly
    assert_trained_as_uninterrupted(crashed)
    # the new rank 2 is the standby worker that waited for it (its pid known before)
    crash = json.loads((tmp_path / "crashed" / "crash.json").read_text())
    assert crash["standby"] is not None and crashed[2]["pid"] == crash["standby"]
    assert crashed[2]["started"] < crash["since_boot"]
    assert {r["synced"] for r in crashed.values()} == {"process group"}  # the default


@pytest.mark.timeout(300)
def test_without_standby_workers_the_new_rank_is_forked_after_the_failure(tmp_path):
    """``--standby-workers 0``: the zygote keeps none, so the lost rank's process is
    forked once it is lost (the test above would fail on its standby check). With
    ``AGENTD_SYNC_ROUTE=shared-memory``, the state goes through shared memory: on one host,
    rank 0 writes it once, and ranks 2 and 3 (it drifted) copy it from there."""
    on = {"AGENTD_SYNC_ROUTE": "shared-memory"}
    crashed = train(tmp_path, "cold", "5", flags=("--standby-workers", "0"), standby=False, env=on)
    crash = json.loads((tmp_path / "cold" / "crash.json").read_text())
    assert crash["standby"] is None
    assert crashed[2]["calls"] == 1 and crashed[2]["started"] >= crash["since_boot"] - 0.01
    assert all(r["weights"] == crashed[0]["weights"] for r in crashed.values())
    assert_trained_as_uninterrupted(crashed)
    assert {r["synced"] for r in crashed.values()} == {"shared memory"}


@pytest.mark.timeout(300)
def test_a_hung_rank_is_killed_before_the_others_park(tmp_path):
    """Rank 2 hangs (stopped, its gloo connections open) while ranks 0, 1 and 3 wait in
    an all-reduce with it; the hang detection finds it. The agent kills it before it asks
    the others to park: their all-reduce then fails and they park at once, kept. Before,
    it was killed only after the park, which waited out ``--inprocess-park-timeout``
    (10 s) for ranks stuck behind it and restarted every rank as a new process (the
    chaos bench's seed 20, ``--place tls --inprocess --stragglers``: 12.6 s to restart
    a node, twice in three runs)."""
    flags = ("--heartbeat-timeout", "5", "--standby-workers", "0")
    hung = train(tmp_path, "hung", "5", flags=flags, standby=False, env={"TEST_HANG": "1"})
    said = (tmp_path / "hung.stderr").read_text()
    assert "hang: rank 2 stopped first" in said, said[-3000:]
    assert "park_timeout" not in said, said[-3000:]
    for rank in (0, 1, 3):
        assert hung[rank]["calls"] == 2 and hung[rank]["restart"] == 1, rank  # kept
    assert hung[2]["calls"] == 1 and hung[2]["restart"] == 0  # the new process
    assert {r["resumed"] for r in hung.values()} == {5}
    assert_trained_as_uninterrupted(hung)
