"""The zygote's record of what its preload read of the environment, and what a forked
worker derives again (the real Lightning, forked and spawned: tests/integration/
test_preload_imports.py)."""

from __future__ import annotations

import io
import logging
import os
import sys
import types

import pytest

from agentd.group import Worker, WorkerGroup
from agentd.preload import import_state
from agentd.spec import WorkerSpec
from agentd.workers.env import WorkerEnvContext, common_env, worker_env


def test_every_way_python_code_reads_a_variable_is_recorded_and_nothing_after(monkeypatch):
    monkeypatch.setenv("AGENTD_TEST_SET", "1")
    environ_type = type(os.environ)
    original = environ_type.__getitem__
    with import_state.environment_reads() as read:
        os.environ.get("AGENTD_TEST_SET")
        _ = "AGENTD_TEST_IN" in os.environ
        os.getenv("AGENTD_TEST_GETENV")
        with pytest.raises(KeyError):
            os.environ["AGENTD_TEST_ITEM"]
        os.environb.get(b"AGENTD_TEST_BYTES")  # the same class, not the text environment
    os.environ.get("AGENTD_TEST_AFTER")
    assert read == {"AGENTD_TEST_SET", "AGENTD_TEST_IN", "AGENTD_TEST_GETENV", "AGENTD_TEST_ITEM"}
    assert environ_type.__getitem__ is original


def test_the_worker_variables_are_what_a_workers_environment_adds_to_the_zygotes():
    spec = WorkerSpec(role="trainer", local_world_size=2, entrypoint="python", args=["x.py"])
    group = WorkerGroup(spec, group_rank=0, group_world_size=1, master_addr="h", master_port=1)
    worker = Worker(local_rank=1, global_rank=1, role_rank=1, world_size=2, role_world_size=2)
    context = WorkerEnvContext(
        "run", 0, 3, True, "mark", 0, "/t", "/p", "/s", "/c"
    )  # every optional file given
    common = common_env(spec)
    env = worker_env(group, worker, "/error.json", context, common)
    added = {name for name, value in env.items() if common.get(name) != value}
    assert added <= import_state.WORKER_VARIABLES
    assert import_state.WORKER_VARIABLES - added <= {"CUDA_VISIBLE_DEVICES"}  # virtual ranks'


def test_a_read_of_the_rank_counts_unless_lightning_derives_it_again(monkeypatch):
    read = {"RANK", "HOME", "WORLD_SIZE", "SLURM_PROCID"}
    monkeypatch.delitem(sys.modules, import_state.LIGHTNING_RANK, raising=False)
    assert import_state.unshared_reads(read) == ["RANK", "WORLD_SIZE"]


def test_a_forked_workers_loggers_write_through_its_own_streams(monkeypatch):
    zygote_stderr, own_stderr = io.StringIO(), io.StringIO()
    logger = logging.getLogger("agentd_test.import_state")
    handler = logging.StreamHandler(zygote_stderr)
    other = logging.StreamHandler(io.StringIO())  # the library's own file: left alone
    logger.addHandler(handler)
    logger.addHandler(other)
    try:
        monkeypatch.setattr(sys, "stderr", own_stderr)
        import_state.rederive({"stderr": zygote_stderr})
        assert handler.stream is own_stderr
        assert other.stream is not own_stderr
    finally:
        logger.removeHandler(handler)
        logger.removeHandler(other)


def test_lightnings_rank_is_read_again_from_the_workers_own_variables(monkeypatch):
    """Lightning's module stands in as the zygote left it: ``rank_zero_only.rank`` 0."""

    def rank_zero_only() -> None: ...

    rank_zero_only.rank = 0  # type: ignore[attr-defined]
    module = types.ModuleType(import_state.LIGHTNING_RANK)
    module.rank_zero_only = rank_zero_only  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, import_state.LIGHTNING_RANK, module)
    assert import_state.unshared_reads({"RANK", "LOCAL_RANK", "WORLD_SIZE"}) == ["WORLD_SIZE"]
    for name in import_state.LIGHTNING_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("SLURM_PROCID", "5")
    import_state.rederive({})
    assert rank_zero_only.rank == 1  # LOCAL_RANK before SLURM_PROCID, as Lightning reads
    monkeypatch.setenv("RANK", "3")
    import_state.rederive({})
    assert rank_zero_only.rank == 3


def test_cuda_visible_devices_read_at_import_varies_only_with_virtual_local_ranks():
    reads = {"torch": ["CUDA_VISIBLE_DEVICES"], "lib": ["CUDA_VISIBLE_DEVICES", "RANK"]}
    assert import_state.varying(reads, virtual_local_rank=False) == {"lib": ["RANK"]}
    assert import_state.varying(reads, virtual_local_rank=True) == reads
