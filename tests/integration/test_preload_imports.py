"""What a preloaded library made of the zygote's process at import, made each worker's:
Lightning forked from the default ``--preload auto`` derives its rank as under torchrun,
and a preload that read a worker's own variable at import is not forked under ``auto``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import TESTS, installed

LIGHTNING_INTROSPECT = str(TESTS / "workers" / "lightning_introspect.py")
SAID = "said on rank zero"


def lightning_reports(agent) -> list[dict]:
    assert agent.wait(180) == 0, agent.stderr()[-3000:]
    return [json.loads((agent.out_dir / f"lightning_{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_lightning_worker_forked_by_default_derives_its_rank_as_under_torchrun(
    run_agentd, tmp_path
):
    """Lightning reads the rank at import: a worker forked from a zygote that imported it
    had rank 0 on every rank (so ``rank_zero_only`` code ran on each before the Trainer
    set the rank), and its loggers wrote through the zygote's stream objects."""
    installed("lightning")
    pytest.importorskip("torch.distributed.run")
    args = ("--standalone", "--nproc-per-node", "2", LIGHTNING_INTROSPECT)
    torchrun = run_agentd(*args, launcher="torchrun", cwd=tmp_path)
    forked = run_agentd(*args, cwd=tmp_path)
    expected = lightning_reports(torchrun)
    assert lightning_reports(forked) == expected
    assert [r["rank_zero_only"] for r in expected] == [0, 1]
    assert all(r["handlers"] and r["handlers_on_own_stderr"] for r in expected), expected
    assert (
        "workers forked from a zygote preloading lightning "
        "(auto: lightning_introspect.py imports lightning)" in forked.stderr()
    )
    for agent in (torchrun, forked):
        assert agent.stderr().count(SAID) == 1, agent.stderr()[-3000:]
    assert "which each worker sets for itself" not in forked.stderr()  # nothing else read


def reading_library(tmp_path: Path) -> Path:
    """A folder on ``PYTHONPATH`` with ``lightning_fabric``, a library ``auto`` preloads,
    here one that reads ``WORLD_SIZE`` at import (and a script that imports it first)."""
    site = tmp_path / "site"
    (site / "lightning_fabric").mkdir(parents=True)
    (site / "lightning_fabric" / "__init__.py").write_text(
        'import os\nWORLD_SIZE_AT_IMPORT = os.environ.get("WORLD_SIZE")\n'
    )
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text(
        textwrap.dedent(
            """\
            import os

            import lightning_fabric

            out = os.path.join(os.environ["TEST_AGENTD_OUT"], "read_" + os.environ["RANK"])
            with open(out, "w") as fp:
                fp.write(str(lightning_fabric.WORLD_SIZE_AT_IMPORT))
            """
        )
    )
    return site


@pytest.mark.parametrize("preload", ["auto", "given"])
def test_a_preload_that_reads_a_workers_variable_at_import_is_named(run_agentd, tmp_path, preload):
    """``auto`` spawns the workers then, each import reading its own ``WORLD_SIZE``; a
    ``--preload`` given keeps forking, with the same warning, and the zygote's value."""
    site = reading_library(tmp_path)
    flags = ["--preload", "lightning_fabric"] if preload == "given" else []
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "2",
        *flags,
        "train.py",
        env={"PYTHONPATH": str(site)},
        cwd=tmp_path / "job",
    )
    assert agent.wait(60) == 0, agent.stderr()[-3000:]
    err = agent.stderr()
    assert "zygote preloading lightning_fabric" in err, err
    assert "importing lightning_fabric read WORLD_SIZE, which each worker sets for itself" in err
    read = [(agent.out_dir / f"read_{r}").read_text() for r in (0, 1)]
    if preload == "auto":
        assert "spawning the workers instead (auto)" in err
        assert read == ["2", "2"]
    else:
        assert "--preload given: forking anyway" in err
        assert read == ["None", "None"]
