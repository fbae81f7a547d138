"""End-to-end runs of the real ``agentd run`` command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import WORKER, pid_alive, processes_of_agent, wait_until

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


def result_json(agent) -> dict:
    [path] = agent.log_dir.glob("*/result.json")
    return json.loads(path.read_text())


def test_agentd_secrets_never_reach_a_worker(run_agentd):
    secrets = {"AGENTD_STORE_TOKEN": "tok-s3cret", "PET_STORE_TOKEN": "pet-s3cret",
               "AGENTD_ETCD_PASSWORD": "pw-s3cret"}  # fmt: skip
    agent = run_agentd("--standalone", "--rdzv-id", "sec", "-r", "1", WORKER, "print-env",
                       env={**secrets, "KEEP_ME": "1"})  # fmt: skip
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


def test_a_crash_loop_keeps_its_log_dir_bounded(run_agentd, tmp_path):
    events = tmp_path / "events.jsonl"
    agent = run_agentd("--rdzv-id", "loop", "--max-restarts", "12", "--keep-attempts", "3",
                       "--event-log", str(events), WORKER, "crash", "--code", "5")  # fmt: skip
    assert agent.wait(60) == 1
    run = agent.log_dir / "loop"
    assert sorted(p.name for p in run.glob("attempt_*")) == [
        "attempt_0", "attempt_10", "attempt_11", "attempt_12"]  # fmt: skip
    assert json.loads((run / "result.json").read_text())["restarts"] == 12
    assert len([ln for ln in events.read_text().splitlines() if '"restart"' in ln]) == 12


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


def test_failure_report_names_root_cause(run_agentd):
    agent = run_agentd(
        "--nproc-per-node", "2", WORKER, "crash", "--rank", "1", "--code", "7", "--after", "0.2"
    )
    assert agent.wait() == 1
    err = agent.stderr()
    assert "worker.py FAILED" in err
    assert "rank      : 1 (local rank 1" in err
    assert "exit code : 7" in err
    assert "rank 1 crashing with 7" in err  # the stderr tail, for lack of an error file
    doc = result_json(agent)
    assert doc["state"] == "FAILED"
    assert doc["root_cause"]["rank"] == 1 and doc["root_cause"]["exitcode"] == 7
    assert len(doc["failures"]) == 1  # rank 0 was stopped by us, not failed


def test_record_error_file_in_report(run_agentd):
    agent = run_agentd("--nproc-per-node", "1", WORKER, "record", "--message", "disk on fire")
    assert agent.wait() == 1
    err = agent.stderr()
    assert "message   : ValueError: disk on fire" in err
    assert "error file:" in err
    assert result_json(agent)["root_cause"]["message"] == "ValueError: disk on fire"


def test_death_by_signal_is_named(run_agentd):
    agent = run_agentd(WORKER, "signal-self")
    assert agent.wait() == 1
    assert "exit code : -9 (SIGKILL)" in agent.stderr()
    assert result_json(agent)["root_cause"]["signal"] == "SIGKILL"


def test_restarts_until_success(run_agentd):
    agent = run_agentd(
        "--nproc-per-node", "2", "--max-restarts", "3", WORKER, "flaky", "--until-attempt", "2"
    )
    assert agent.wait() == 0, agent.stderr()
    assert agent.stdout().count("succeeded on restart 2") == 2
    doc = result_json(agent)
    assert (doc["restarts"], doc["attempts"]) == (2, 3)
    assert len(list(agent.log_dir.glob("*/attempt_*"))) == 3


def test_non_retryable_exit_code_fails_at_once(run_agentd):
    agent = run_agentd(
        "--max-restarts",
        "5",
        "--non-retryable-exit-codes",
        "3,4",
        WORKER,
        "flaky",
        "--code",
        "4",
        "--until-attempt",
        "9",
    )
    assert agent.wait() == 1
    assert "non-retryable" in agent.stderr()
    assert result_json(agent)["restarts"] == 0


def test_crash_seen_while_grandchild_holds_the_pipe(run_agentd):
    agent = run_agentd("--stop-timeout", "5", WORKER, "crash-holding-pipe", "--code", "5")
    assert agent.wait() == 1
    assert "exit code : 5" in agent.stderr()
    assert processes_of_agent(agent.pid) == []


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


def test_sigterm_stops_workers_and_exits_143(run_agentd):
    agent = run_agentd("--nproc-per-node", "2", WORKER, "tree")
    pids = agent.wait_ready(2)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 128 + signal.SIGTERM
    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=5, what="workers gone")
    assert "stopped by SIGTERM" in agent.stderr()
    assert result_json(agent)["state"] == "STOPPED"


def test_stop_timeout_then_sigkill(run_agentd):
    agent = run_agentd("--stop-timeout", "0.3", WORKER, "ignore-term")
    [pid] = agent.wait_ready(1)
    agent.proc.send_signal(signal.SIGINT)
    assert agent.wait() == 128 + signal.SIGINT
    assert not pid_alive(pid)


def test_second_sigint_forces_kill(run_agentd):
    agent = run_agentd("--stop-timeout", "600", WORKER, "ignore-term")
    [pid] = agent.wait_ready(1)
    agent.proc.send_signal(signal.SIGINT)
    wait_until(lambda: "Stopping 1 running worker" in agent.stderr(), what="stop started")
    agent.proc.send_signal(signal.SIGINT)
    assert agent.wait(timeout=10) == 128 + signal.SIGINT
    assert not pid_alive(pid)


def test_kill_9_leaves_nothing_behind(run_agentd):
    agent = run_agentd("--nproc-per-node", "2", WORKER, "tree")
    pids = agent.wait_ready(2)
    assert len(pids) == 6  # 2 workers, each with a grandchild in its group and one escaped
    agent.proc.kill()
    agent.wait()
    wait_until(
        lambda: not any(pid_alive(p) for p in pids),
        timeout=1.0,
        what="workers and grandchildren dead within a second",
    )


def test_leftovers_of_a_dead_agent_are_cleaned_at_start(run_agentd):
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names an agent that no longer exists
    mark = f"{dead.pid}.1/same"
    leftover = subprocess.Popen(["sleep", "600"], env={**os.environ, "AGENTD_OWNER": mark})
    other_run = subprocess.Popen(["sleep", "600"], env={**os.environ, "AGENTD_OWNER": mark + "x"})
    try:
        agent = run_agentd("--rdzv-id", "same", WORKER, "ok")
        assert agent.wait() == 0
        assert leftover.wait(timeout=5) == -signal.SIGKILL
        assert "left by an earlier agent of run same" in agent.stderr()
        assert other_run.poll() is None  # another run's processes are not ours
    finally:
        for proc in (leftover, other_run):
            proc.kill()
            proc.wait()


def test_leftover_cleanup_spares_live_agents(run_agentd):
    first = run_agentd("--rdzv-id", "same", WORKER, "sleep")
    [old] = first.wait_ready(1)
    os.kill(first.pid, signal.SIGSTOP)  # a frozen agent still counts as alive
    second = run_agentd("--rdzv-id", "same", WORKER, "ok")
    assert second.wait() == 0
    assert pid_alive(old)  # a live agent's workers are never touched
    os.kill(first.pid, signal.SIGCONT)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-restarts", "-1", WORKER], "--max-restarts: '-1' must be >= 0"),
        (
            ["--nproc-per-node", "zero", WORKER],
            "--nproc-per-node: 'zero' must be an integer within",
        ),
        (["--stop-signal", "SIGNOPE", WORKER], "--stop-signal: 'SIGNOPE' is not a signal"),
        (["--redirects", "7", WORKER], "--redirects: '7' must be 0-3"),
        (["--bogus-flag", WORKER], "unrecognized arguments: --bogus-flag"),
        (["missing_script.py"], "script: 'missing_script.py' does not exist"),
        (["-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        (["--no-python", "no-such-binary-xyz"], "'no-such-binary-xyz' is not on PATH"),
        (["--nnodes", "1:2", WORKER], "--nnodes: '1:2' needs an elastic backend"),
        (["--nnodes", "2", "--node-rank", "2", WORKER], "--node-rank: 2 must be within 0..1"),
        (["--standalone", "--nnodes", "2", WORKER], "cannot be combined with --standalone"),
        (["--rdzv-backend", "c10d", "--nnodes", "2", WORKER], "--rdzv-endpoint: required"),
        (
            ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:x", WORKER],
            "--rdzv-endpoint: '127.0.0.1:x' has no valid port",
        ),
        (
            ["--standalone", "--rdzv-conf", "join_timeout=-1", WORKER],
            "--rdzv-conf: join_timeout='-1' must be a number of seconds > 0",
        ),
        (
            ["--standalone", "--rdzv-conf", "bogus=1", WORKER],
            "--rdzv-conf: 'bogus' is not a setting of the agentd backend",
        ),
        (
            ["--standalone", "--rdzv-conf", "novalue", WORKER],
            "--rdzv-conf: 'novalue' must be key=value",
        ),
        (["--log-line-prefix-template", "{nope}", WORKER], "unknown field(s) ['nope']"),
        (
            ["--log-line-prefix-template", "{rank:>99999999}", WORKER],
            "field {rank} may not have a format spec",
        ),
        (["--rdzv-id", "../../etc", WORKER], "--rdzv-id: '../../etc' must be 1..128 characters"),
        (["--rdzv-id", "a/b", WORKER], "--rdzv-id: 'a/b' must be 1..128 characters"),
        (["--rdzv-id", "x" * 5000, WORKER], "--rdzv-id: 'xxxxxxxx"),
        (["--role", "../up", WORKER], "--role: '../up' must be 1..128 characters"),
        (
            ["--nproc-per-node", "100000", WORKER],
            "--nproc-per-node: '100000' must be an integer within 1..1024",
        ),
        (
            [
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "127.0.0.1:1",
                "--nnodes",
                "1:999999999999999999999",
                WORKER,
            ],
            "--nnodes: '1:999999999999999999999' must be at most 65536 nodes",
        ),
        (
            ["--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1", WORKER],
            "--rdzv-endpoint: '[::1' must be host:port, or [IPv6]:port",
        ),
        (
            ["--non-retryable-exit-codes", "1,,2", WORKER],
            "--non-retryable-exit-codes: '1,,2' has an empty item",
        ),
        (["--rdzv-backend", "etcd", WORKER], "--rdzv-endpoint: required by --rdzv-backend etcd"),
        (
            [
                "--rdzv-backend",
                "etcd-v2",
                "--rdzv-endpoint",
                "h",
                "--rdzv-conf",
                "is_host=1",
                WORKER,
            ],
            "--rdzv-conf: 'is_host' is not a setting of the etcd-v2 backend",
        ),
    ],
)
def test_bad_input_one_line_exit_2(run_agentd, args, message):
    agent = run_agentd(*args)
    assert agent.wait() == 2
    err = agent.stderr()
    assert err.count("\n") == 1, err
    assert message in err
    assert list(agent.out_dir.glob("pid_*")) == []


def test_bad_config_file_and_env(run_agentd, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('max_restarts = "many"\n')
    agent = run_agentd("--config", str(bad), WORKER)
    assert agent.wait() == 2
    assert agent.stderr() == f"agentd: error: {bad}: max_restarts: 'many' is not an integer\n"
    agent = run_agentd(WORKER, env={"AGENTD_STOP_TIMEOUT": "-1"})
    assert agent.wait() == 2
    assert agent.stderr() == "agentd: error: AGENTD_STOP_TIMEOUT: '-1' must be >= 0\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [("script = 5\n", "script: 5 must be a non-empty string"),
     ('args = "notalist"\n', "args: 'notalist' must be a list of strings")],
)  # fmt: skip
def test_a_broken_job_in_the_config_file_fails_even_when_the_cli_names_one(
    run_agentd, tmp_path, text, message
):
    bad = tmp_path / "job.toml"
    bad.write_text(text)
    agent = run_agentd("--config", str(bad), WORKER, "ok")
    assert agent.wait() == 2
    assert agent.stderr() == f"agentd: error: {bad}: {message}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--url", "notaurl"], "--url: 'notaurl' must be an http(s)://host:port URL"),
     (["--url", "http://127.0.0.1:99999"], "is not a valid URL (Port out of range"),
     (["--timeout", "-1"], "--timeout: -1.0 must be within 0..3600 seconds")],
)  # fmt: skip
def test_status_with_a_bad_url_is_one_line_exit_2(run_agentd, args, message):
    agent = run_agentd(*args, command="status")
    assert agent.wait() == 2
    assert agent.stderr().count("\n") == 1 and message in agent.stderr(), agent.stderr()


def test_config_file_and_pet_env(run_agentd, tmp_path):
    config = tmp_path / "job.toml"
    config.write_text(f'nproc-per-node = 2\nscript = "{WORKER}"\nargs = ["ok"]\n')
    agent = run_agentd("--config", str(config), env={"PET_NPROC_PER_NODE": "3"})
    assert agent.wait() == 0, agent.stderr()
    assert len(agent.stdout().splitlines()) == 3  # PET_ beats the file


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
