"""The default (``--preload auto``) on a real GPU: a CUDA job's workers are forked from a
zygote that imported torch, each initialises CUDA itself, and a script's own
``CUDA_VISIBLE_DEVICES`` works as it does spawned (skipped without CUDA)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu.test_gpu import WORKERS, agentd

PROBE = str(WORKERS / "cuda_probe.py")


def probe(
    tmp_path: Path, name: str, *flags: str, script: str = PROBE, hide: bool = False, nproc: int = 1
) -> tuple[list[dict], str]:
    """Run ``script`` under ``agentd run FLAGS``: each rank's report, and the agent's log."""
    out = tmp_path / name
    out.mkdir()
    args = [str(out), "hide"] if hide else [str(out)]
    done = agentd(out, nproc, *flags, script, *args, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((out / f"probe_{rank}.json").read_text()) for rank in range(nproc)]
    return reports, done.stderr


@pytest.mark.timeout(300)
def test_a_cuda_job_is_forked_by_default_and_sees_what_a_spawned_one_sees(tmp_path):
    forked, said = probe(tmp_path, "forked", nproc=2)
    assert "workers forked from a zygote preloading torch (auto: cuda_probe.py imports" in said
    assert "which each worker sets for itself" not in said  # CUDA torch's import reads none
    spawned, said = probe(tmp_path, "spawned", "--no-preload", nproc=2)
    assert "workers spawned (--preload off)" in said
    assert forked == spawned
    assert forked[0]["count"] >= 1 and forked[0]["sum"] == 4.0


@pytest.mark.timeout(300)
def test_a_script_that_hides_the_gpus_itself_works_unchanged(tmp_path):
    forked, _ = probe(tmp_path, "after", hide=True)
    spawned, _ = probe(tmp_path, "after_spawned", "--no-preload", hide=True)
    assert forked == spawned == [{"count": 0, "visible": "", "local_rank": "0"}]
    first, said = probe(tmp_path, "before", script=str(WORKERS / "cuda_probe_env_first.py"))
    assert "workers spawned (auto: cuda_probe_env_first.py:" in said
    assert "changes the environment before it imports torch" in said
    assert first == forked


@pytest.mark.timeout(300)
def test_virtual_local_rank_gives_each_forked_worker_its_own_gpu(tmp_path):
    reports, said = probe(tmp_path, "virtual", "--virtual-local-rank")
    assert "preloading torch" in said
    assert reports == [{"count": 1, "visible": "0", "local_rank": "0", "sum": 4.0}]
