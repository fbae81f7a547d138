"""``agentd run`` end to end: what workers see, output routing, entrypoints, the log."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import WORKER, wait_until
from tests.helpers.jobs import result_json

TORCH_ENV_KEYS = {
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
}


def test_agentd_secrets_never_reach_a_worker(run_agentd):
    secrets = {
        "AGENTD_STORE_TOKEN": "tok-s3cret",
        "PET_STORE_TOKEN": "pet-s3cret",
        "AGENTD_ETCD_PASSWORD": "pw-s3cret",
    }
    agent = run_agentd(
        "--standalone",
        "--rdzv-id",
        "sec",
        "-r",
        "1",
        WORKER,
        "print-env",
        env={**secrets, "KEEP_ME": "1"},
    )
    assert agent.wait() == 0, agent.stderr()
    [stdout_log] = agent.log_dir.glob("sec/attempt_0/0/stdout.log")
    env = json.loads(stdout_log.read_text())
    assert env["KEEP_ME"] == "1" and not set(secrets) & set(env)
    files = [p for p in agent.log_dir.rglob("*") if p.is_file()]
    assert files and not any("s3cret" in p.read_text(errors="replace") for p in files)
    assert "s3cret" not in agent.stderr() + agent.stdout()


def test_the_agent_raises_its_open_files_limit_and_its_workers_keep_theirs(run_agentd):
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 1024:
        pytest.skip("the hard limit leaves nothing to raise")

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    agent = run_agentd(WORKER, "limits", preexec=low)
    agent.wait_ready(1)
    wait_until(lambda: "nofile" in agent.stdout())
    assert agent.stdout().split()[:3] == ["nofile", "1024", str(hard)]  # as under torchrun
    limits = Path(f"/proc/{agent.pid}/limits").read_text()
    [line] = [ln for ln in limits.splitlines() if ln.startswith("Max open files")]
    assert line.split()[3] == str(min(hard, 1 << 20))  # the agent's own: raised
    agent.proc.terminate()
    assert agent.wait() == 128 + signal.SIGTERM


def test_success_exit_0_and_output(run_agentd):
    agent = run_agentd("--nproc-per-node", "2", WORKER, "ok")
    assert agent.wait() == 0, agent.stderr()
    assert sorted(agent.stdout().splitlines()) == ["hello from rank 0", "hello from rank 1"]
    assert agent.stderr().count("note on stderr from rank") == 2
    assert result_json(agent)["state"] == "SUCCEEDED"


def test_worker_environment_matches_torchrun(run_agentd):
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "3",
        "--rdzv-id",
        "job7",
        "--max-restarts",
        "2",
        "--role",
        "trainer",
        WORKER,
        "env",
        "--",
        "lr=${local_rank}",
    )
    assert agent.wait() == 0, agent.stderr()
    envs = [json.loads((agent.out_dir / f"env_{r}_0").read_text()) for r in range(3)]
    ports = {e["env"]["MASTER_PORT"] for e in envs}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    for rank, doc in enumerate(envs):
        env = doc["env"]
        assert TORCH_ENV_KEYS <= set(env), TORCH_ENV_KEYS - set(env)
        assert env["RANK"] == env["LOCAL_RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "3"
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert env["ROLE_NAME"] == "trainer"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["TORCHELASTIC_RUN_ID"] == "job7"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "2"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the agent serves the store
        assert env["OMP_NUM_THREADS"] == "1"
        assert env["PYTHONUNBUFFERED"] == "1"
        error_file = Path(env["TORCHELASTIC_ERROR_FILE"])
        assert error_file == agent.log_dir / "job7" / "attempt_0" / str(rank) / "error.json"
        assert doc["argv"] == ["env", "--", f"lr={rank}"]


def test_redirects_tee_and_prefix(run_agentd):
    agent = run_agentd(
        "--nproc-per-node",
        "2",
        "--redirects",
        "1",
        "--tee",
        "0:2",
        "--log-line-prefix-template",
        "<{role}:{rank}@{attempt}> ",
        "--rdzv-id",
        "r1",
        WORKER,
        "ok",
    )
    assert agent.wait() == 0, agent.stderr()
    assert agent.stdout() == ""  # stdout redirected to files for every rank
    base = agent.log_dir / "r1" / "attempt_0"
    for rank in (0, 1):
        assert (base / str(rank) / "stdout.log").read_text() == f"hello from rank {rank}\n"
    assert (base / "0" / "stderr.log").read_text() == "note on stderr from rank 0\n"
    assert "<default:0@0> note on stderr from rank 0\n" in agent.stderr()
    assert "note on stderr from rank 1\n" in agent.stderr()  # rank 1 stderr: console, no prefix
    assert not (base / "1" / "stderr.log").exists()


def test_tee_keeps_lines_whole(run_agentd):
    agent = run_agentd("--nproc-per-node", "2", "--tee", "3", WORKER, "lines")
    assert agent.wait() == 0, agent.stderr()
    lines = agent.stdout().splitlines()
    for rank in (0, 1):
        mine = [ln for ln in lines if ln.startswith(f"[default{rank}]:")]
        assert mine == [f"[default{rank}]:part-{i}-a part-{i}-b" for i in range(3)] + [
            f"[default{rank}]:no newline at end"
        ]


def test_local_ranks_filter(run_agentd):
    agent = run_agentd("--nproc-per-node", "3", "--local-ranks-filter", "1", WORKER, "ok")
    assert agent.wait() == 0, agent.stderr()
    assert agent.stdout() == "hello from rank 1\n"


def test_module_and_no_python(run_agentd, tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "hello.py").write_text("import sys; print('module', sys.argv[1:])\n")
    agent = run_agentd("-m", "mypkg.hello", "a", "b")
    assert agent.wait() == 0, agent.stderr()
    assert agent.stdout() == "module ['a', 'b']\n"
    agent = run_agentd("--no-python", "echo", "rank=${local_rank}")
    assert agent.wait() == 0, agent.stderr()
    assert agent.stdout() == "rank=0\n"


def test_json_log_format(run_agentd):
    agent = run_agentd("--log-format", "json", WORKER, "crash", "--code", "2")
    assert agent.wait() == 1
    records = [json.loads(ln) for ln in agent.stderr().splitlines() if ln.startswith("{")]
    assert any("FAILED" in r["message"] and r["level"] == "ERROR" for r in records)


def test_python_dash_m_agentd_and_version():
    out = subprocess.run(
        [sys.executable, "-m", "agentd", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("agentd ")
