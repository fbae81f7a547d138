"""torch's ``LogsSpecs``: a site's own subclass decides where the workers' output and error
files go (its ``reify``), for ``start_processes`` and for ``LocalElasticAgent``; the
default one's ``reify`` gives a layout by run, attempt and local rank."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.torch_api.conftest import elastic

SAY = (
    "import os, sys; print('out', os.environ['LOCAL_RANK']); "
    "print('err', os.environ['LOCAL_RANK'], file=sys.stderr); "
    "print(os.environ['TORCHELASTIC_ERROR_FILE'])"
)
FAIL_ON_ONE = (
    "import json, os, sys; rank = os.environ['LOCAL_RANK']; "
    "path = os.environ['TORCHELASTIC_ERROR_FILE']; "
    "rank == '1' and open(path, 'w').write(json.dumps({'message': 'rank 1 gave up'})); "
    "sys.exit(3 if rank == '1' else 0)"
)


def flat_logs(impl: str, folder: Path):
    """A site's log specs, as a torch user writes them (reading torch's attributes):
    every rank's files side by side in one folder, named by rank, stdout teed to the
    console."""
    mp = elastic(impl, "multiprocessing")

    class FlatLogs(mp.LogsSpecs):
        def __init__(self) -> None:
            super().__init__(log_dir=str(folder), redirects=mp.Std.ALL, tee=mp.Std.OUT)

        @property
        def root_log_dir(self) -> str:
            return str(folder)

        def reify(self, envs):
            ranks = range(len(envs))
            dest = mp.LogsDest(
                stdouts={r: str(folder / f"out-{r}.txt") for r in ranks},
                stderrs={r: str(folder / f"err-{r}.txt") for r in ranks if self._redirects},
                tee_stdouts={r: str(folder / f"out-{r}.txt") for r in ranks},
                tee_stderrs={},
                error_files={r: str(folder / f"error-{r}.json") for r in ranks},
            )
            for r in ranks:
                envs[r]["TORCHELASTIC_ERROR_FILE"] = dest.error_files[r]
            return dest

    return FlatLogs()


@contextlib.contextmanager
def torchs_open_files_ignored(impl: str) -> Iterator[None]:
    """torch's process context leaves its workers' log files open (ResourceWarnings as
    they are collected); agentd's closes them, and is held to it."""
    if impl != "torch":
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        yield
        gc.collect()


def _envs(n: int) -> dict[int, dict[str, str]]:
    return {r: {"LOCAL_RANK": str(r), "PATH": os.environ["PATH"]} for r in range(n)}


def test_start_processes_writes_where_a_sites_reify_says(impl, tmp_path, capfd):
    mp = elastic(impl, "multiprocessing")
    args = {r: ("-c", SAY) for r in range(2)}
    logs = flat_logs(impl, tmp_path)
    with torchs_open_files_ignored(impl):
        context = mp.start_processes("say", sys.executable, args, _envs(2), logs)
        try:
            result = context.wait()
        finally:
            context.close()
        del context  # torch's files go with it
    assert not result.is_failed()
    assert sorted(os.listdir(tmp_path)) == ["err-0.txt", "err-1.txt", "out-0.txt", "out-1.txt"]
    for r in range(2):
        lines = (tmp_path / f"out-{r}.txt").read_text().splitlines()
        assert lines == [f"out {r}", str(tmp_path / f"error-{r}.json")]
        assert (tmp_path / f"err-{r}.txt").read_text() == f"err {r}\n"
        assert result.stdouts[r] == str(tmp_path / f"out-{r}.txt")
    assert "out 1" in capfd.readouterr().out  # teed


def one_node_spec(impl: str, run_id: str, nproc: int, code: str):
    """A ``WorkerSpec`` of ``nproc`` workers running ``python -c code``, one node meeting
    at a c10d endpoint of its own, as a torch user builds it."""
    server = elastic(impl, "agent.server")
    rdzv, registry = elastic(impl, "rendezvous"), elastic(impl, "rendezvous.registry")
    params = rdzv.RendezvousParameters(
        backend="c10d",
        endpoint=f"127.0.0.1:{free_port()}",
        run_id=run_id,
        min_nodes=1,
        max_nodes=1,
    )
    return server.WorkerSpec(
        role="trainer",
        local_world_size=nproc,
        rdzv_handler=registry.get_rendezvous_handler(params),
        entrypoint=sys.executable,
        args=("-c", code),
        max_restarts=0,
    )


def test_the_agent_writes_where_a_sites_reify_says_and_reads_its_error_file(impl, tmp_path):
    server = elastic(impl, "agent.server")
    local = elastic(impl, "agent.server.local_elastic_agent")
    spec = one_node_spec(impl, "flat", 2, FAIL_ON_ONE)
    logs = tmp_path / "logs"
    logs.mkdir()
    with torchs_open_files_ignored(impl):
        result = local.LocalElasticAgent(spec, flat_logs(impl, logs), "spawn").run()
    assert result.state == server.WorkerState.FAILED
    assert {"err-0.txt", "err-1.txt", "out-0.txt", "out-1.txt", "error-1.json"} <= set(
        os.listdir(logs)
    )
    failure = result.failures[1]
    assert failure.error_file == str(logs / "error-1.json")
    assert json.loads((logs / "error-1.json").read_text())["message"] == "rank 1 gave up"
    assert "rank 1 gave up" in str(failure.message)


def test_agentds_agent_takes_torchs_own_log_specs(tmp_path):
    """Code that moved to agentd's agent but kept torch's ``DefaultLogsSpecs``: its
    settings are read, and its layout is torch's (its reify's)."""
    torch_mp = pytest.importorskip("torch.distributed.elastic.multiprocessing")
    server = elastic("agentd", "agent.server")
    local = elastic("agentd", "agent.server.local_elastic_agent")
    spec = one_node_spec("agentd", "mixed", 1, SAY)
    logs = torch_mp.DefaultLogsSpecs(log_dir=str(tmp_path), redirects=torch_mp.Std.ALL)
    result = local.LocalElasticAgent(spec, logs, "spawn").run()
    assert result.state == server.WorkerState.SUCCEEDED
    (out,) = [p for p in tmp_path.glob("mixed_*/attempt_0/0/stdout.log")]
    assert out.read_text().splitlines()[0] == "out 0"
    assert sorted(p.name for p in out.parent.iterdir()) == ["stderr.log", "stdout.log"]


def test_the_default_reify_lays_files_out_by_run_attempt_and_rank(impl, tmp_path):
    mp = elastic(impl, "multiprocessing")
    envs = {r: {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "2"} for r in range(2)}
    dest = mp.DefaultLogsSpecs(log_dir=str(tmp_path), redirects=mp.Std.ERR).reify(envs)
    run = Path(dest.error_files[0]).parent.parent.parent
    assert run.parent == tmp_path and run.name.startswith("job")  # torch adds a suffix
    for r in range(2):
        folder = run / "attempt_2" / str(r)
        assert folder.is_dir()
        assert (
            dest.error_files[r] == envs[r]["TORCHELASTIC_ERROR_FILE"] == str(folder / "error.json")
        )
        assert dest.stderrs[r] == str(folder / "stderr.log")
        assert dest.stdouts[r] == ""  # the console


def test_a_devnull_log_dir_makes_no_files_and_leaves_output_on_the_console(impl):
    mp = elastic(impl, "multiprocessing")
    envs = {0: {"TORCHELASTIC_RUN_ID": "job"}}
    dest = mp.DefaultLogsSpecs(log_dir=os.devnull, redirects=mp.Std.ALL).reify(envs)
    assert dest.stdouts[0] == dest.stderrs[0] == ""
    assert dest.error_files[0] == os.devnull
    assert envs[0]["TORCHELASTIC_ERROR_FILE"] == ""
